// Test workload for user-stack unwinding: spins in deep_leaf, three
// calls below main (deep_leaf <- deep_mid <- deep_top <- main). The tests
// build it with -O2 -fomit-frame-pointer (static and dynamic) and with
// frame pointers, and expect whole stacks either way.
//
// Protocol (as burn.c): prints "ready <pid>", waits for a line on stdin,
// spins argv[1] seconds of CPU time (default 3), prints
// "cpu_ns <process CPU time in ns>" and exits.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

volatile uint64_t sink;

static uint64_t cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// Where nearly every sample lands: a frameless leaf.
__attribute__((noinline)) uint64_t deep_leaf(uint64_t iters)
{
	uint64_t x = sink;
	for (uint64_t i = 0; i < iters; i++)
		x = x * 6364136223846793005ull + 1442695040888963407ull;
	return x;
}

// A frame with locals (CFA far from rsp without frame pointers); the
// volatile use after the call keeps it from being a tail call.
__attribute__((noinline)) void deep_mid(uint64_t deadline)
{
	volatile uint64_t scratch[32];
	while (cpu_ns() < deadline) {
		scratch[sink & 31] = deep_leaf(2000000);
		sink += scratch[(sink + 1) & 31];
	}
}

__attribute__((noinline)) void deep_top(double seconds)
{
	deep_mid(cpu_ns() + (uint64_t)(seconds * 1e9));
	sink++;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 3.0;
	char line[64];

	setvbuf(stdout, NULL, _IONBF, 0);
	printf("ready %ld\n", (long)getpid());
	if (!fgets(line, sizeof line, stdin))
		return 1;
	deep_top(seconds);
	printf("cpu_ns %llu\n", (unsigned long long)cpu_ns());
	return 0;
}
