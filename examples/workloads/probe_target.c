// Calls profcol_probe_target exactly as often as it is told to: the uprobe
// tests count those calls.
//
// Protocol: prints `ready <pid>`, then for each stdin line `call N` calls
// the function N times and prints `called N`; exits 0 at end of input.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile unsigned long profcol_probe_sink;

__attribute__((noinline)) void profcol_probe_target(unsigned long x)
{
	profcol_probe_sink += x;
}

__attribute__((noinline)) static void call_many(unsigned long n)
{
	for (unsigned long i = 0; i < n; i++)
		profcol_probe_target(i);
}

int main(void)
{
	char line[64];
	printf("ready %d\n", getpid());
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		unsigned long n;
		if (sscanf(line, "call %lu", &n) == 1) {
			call_many(n);
			printf("called %lu\n", n);
			fflush(stdout);
		}
	}
	return 0;
}
