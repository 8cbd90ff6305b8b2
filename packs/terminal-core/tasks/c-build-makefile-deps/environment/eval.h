#ifndef EVAL_H
#define EVAL_H

/* Evaluate a space-separated RPN expression of integers and + - * /.
 * Returns 0 and sets *out on success; prints a message to stderr and returns -1 otherwise. */
int eval_rpn(const char *expr, long *out);

#endif
