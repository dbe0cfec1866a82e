// Test workload for the ebpf receiver: burns CPU in a function with a known
// name. Build with frame pointers so user stacks can be walked:
//
//     cc -O1 -g -fno-omit-frame-pointer -fno-inline -o burn burn.c
//
// Protocol (driven by receivers/tests/ebpf_sampling.rs):
//   prints "ready <pid>", waits for a line on stdin, burns argv[1] seconds
//   of CPU time (default 3; CPU time, not wall time, so a shared host only
//   stretches the run) inside profcol_burn_hot, then prints
//   "cpu_ns <process CPU time in ns>" and exits.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

volatile uint64_t sink;

// The function the test expects to find in >= 70% of this process's samples.
__attribute__((noinline)) uint64_t profcol_burn_hot(uint64_t iters)
{
	uint64_t x = sink;
	for (uint64_t i = 0; i < iters; i++)
		x = x * 6364136223846793005ull + 1442695040888963407ull;
	return x;
}

__attribute__((noinline)) void profcol_burn_outer(double seconds)
{
	uint64_t deadline = now_ns(CLOCK_THREAD_CPUTIME_ID) + (uint64_t)(seconds * 1e9);
	while (now_ns(CLOCK_THREAD_CPUTIME_ID) < deadline)
		sink = profcol_burn_hot(2000000);
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 3.0;
	char line[64];

	setvbuf(stdout, NULL, _IONBF, 0);
	printf("ready %ld\n", (long)getpid());
	if (!fgets(line, sizeof line, stdin))
		return 1;
	uint64_t cpu0 = now_ns(CLOCK_PROCESS_CPUTIME_ID);
	profcol_burn_outer(seconds);
	printf("cpu_ns %llu\n", (unsigned long long)(now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0));
	return 0;
}
