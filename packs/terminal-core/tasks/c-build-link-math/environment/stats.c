/* stats: read numbers (one per line) from stdin and print
 *   n=<count> mean=<mean> sd=<population standard deviation> rms=<root mean square>
 * each value with 4 decimals. With no numbers it prints "n=0" and exits 0. */
#include <math.h>
#include <stdio.h>

int main(void)
{
    double x, sum = 0, sumsq = 0;
    long n = 0;
    while (scanf("%lf", &x) == 1) {
        sum += x;
        sumsq += pow(x, 2);
        n++;
    }
    if (n == 0) {
        printf("n=0\n");
        return 0;
    }
    double mean = sum / n;
    double var = sumsq / n - mean * mean;
    printf("n=%ld mean=%.4f sd=%.4f rms=%.4f\n", n, mean, sqrt(var > 0 ? var : 0), sqrt(sumsq / n));
    return 0;
}
