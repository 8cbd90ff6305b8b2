#include <stdio.h>

#include "registry.h"

void record(const char *what)
{
    event_count++;
    printf("event %d: %s\n", event_count, what);
}
