/* wordfreq: count the words read from stdin and print them by frequency.
 * A word is a maximal run of ASCII letters, compared case-insensitively (printed lowercase).
 * Output: "<count> <word>" lines, most frequent first, ties in alphabetical order. */
#include <stdio.h>
#include <ctype.h>

struct entry {
    char *word;
    int count;
};

static struct entry *table;
static size_t used, cap;

static void add(const char *w)
{
    for (size_t i = 0; i < used; i++) {
        if (strcmp(table[i].word, w) == 0) {
            table[i].count++;
            return;
        }
    }
    if (used == cap) {
        cap = cap ? cap * 2 : 16;
        table = realloc(table, cap * sizeof *table);
        if (!table) {
            perror("realloc");
            exit(1);
        }
    }
    table[used].word = strdup(w);
    table[used].count = 1;
    used++;
}

static int by_count(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    if (x->count != y->count)
        return y->count - x->count;
    return strcmp(x->word, y->word);
}

int main(void)
{
    char buf[256];
    size_t n = 0;
    int c;
    while ((c = getchar()) != EOF) {
        if (isalpha(c) && c < 128) {
            if (n < sizeof buf - 1)
                buf[n++] = (char)tolower(c);
        } else if (n) {
            buf[n] = '\0';
            add(buf);
            n = 0;
        }
    }
    if (n) {
        buf[n] = '\0';
        add(buf);
    }
    qsort(table, used, sizeof *table, by_count);
    for (size_t i = 0; i < used; i++)
        printf("%d %s\n", table[i].count, table[i].word);
    return 0;
}
