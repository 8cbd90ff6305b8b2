#include "stack.h"

static long items[STACK_MAX];
static int top;

int push(long v)
{
    if (top >= STACK_MAX)
        return -1;
    items[top++] = v;
    return 0;
}

int pop(long *v)
{
    if (top == 0)
        return -1;
    *v = items[--top];
    return 0;
}

int depth(void)
{
    return top;
}
