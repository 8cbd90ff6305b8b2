#include <stdio.h>

#include "eval.h"

int main(int argc, char **argv)
{
    long v;
    if (argc != 2) {
        fprintf(stderr, "usage: rpn 'EXPR'\n");
        return 2;
    }
    if (eval_rpn(argv[1], &v))
        return 1;
    printf("%ld\n", v);
    return 0;
}
