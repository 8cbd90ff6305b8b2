#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "stack.h"

int eval_rpn(const char *expr, long *out)
{
    char buf[1024];
    long a, b;
    strncpy(buf, expr, sizeof buf - 1);
    buf[sizeof buf - 1] = '\0';
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        if (strlen(tok) == 1 && strchr("+-*/", tok[0])) {
            if (pop(&b) || pop(&a)) {
                fprintf(stderr, "stack underflow\n");
                return -1;
            }
            if (tok[0] == '/' && b == 0) {
                fprintf(stderr, "division by zero\n");
                return -1;
            }
            long r = tok[0] == '+' ? a + b : tok[0] == '-' ? a - b : tok[0] == '*' ? a * b : a / b;
            push(r);
        } else if (push(strtol(tok, NULL, 10))) {
            fprintf(stderr, "stack overflow\n");
            return -1;
        }
    }
    if (depth() != 1 || pop(out)) {
        fprintf(stderr, "malformed expression\n");
        return -1;
    }
    return 0;
}
