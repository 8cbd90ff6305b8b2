#ifndef REGISTRY_H
#define REGISTRY_H

/* how many events have been recorded, over the whole program */
int event_count = 0;

void record(const char *what);

#endif
