#ifndef STACK_H
#define STACK_H

#define STACK_MAX 64

/* push/pop return 0 on success, -1 on overflow/underflow */
int push(long v);
int pop(long *v);
int depth(void);

#endif
