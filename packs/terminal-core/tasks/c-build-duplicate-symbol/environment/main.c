#include <stdio.h>

#include "registry.h"

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        record(argv[i]);
    event_count += 100; /* main owns the final tally: add the startup events */
    printf("total %d\n", event_count);
    return 0;
}
