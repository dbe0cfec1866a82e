// Test workload for unwinding through signal frames: most of its CPU
// time is spent inside a SIGPROF handler (sig_leaf <- sig_handler <-
// libc's __restore_rt <- the interrupted code), the interrupted code
// being the chain work_leaf <- work_mid <- work_top <- main. The tests
// build it with -O2 -fomit-frame-pointer (static and dynamic).
//
// Protocol (as burn.c): prints "ready <pid>", waits for a line on stdin,
// runs argv[1] seconds of CPU time (default 3), prints
// "cpu_ns <process CPU time in ns>" and exits.
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

volatile uint64_t sink;

static uint64_t cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t spin(uint64_t iters)
{
	uint64_t x = sink;
	for (uint64_t i = 0; i < iters; i++)
		x = x * 6364136223846793005ull + 1442695040888963407ull;
	return x;
}

// Where most samples land: a frameless leaf called by the handler.
__attribute__((noinline)) uint64_t sig_leaf(uint64_t iters)
{
	return spin(iters);
}

// The handler: a frame with locals, spinning about 8 ms of every 10 ms of
// CPU time (the SIGPROF period).
__attribute__((noinline)) void sig_handler(int sig)
{
	volatile uint64_t scratch[16];
	uint64_t until = cpu_ns() + 8000000;
	while (cpu_ns() < until) {
		scratch[sink & 15] = sig_leaf(200000);
		sink += scratch[(sink + sig) & 15];
	}
}

// The interrupted code: the chain of deep.c.
__attribute__((noinline)) uint64_t work_leaf(uint64_t iters)
{
	return spin(iters);
}

__attribute__((noinline)) void work_mid(uint64_t deadline)
{
	volatile uint64_t scratch[32];
	while (cpu_ns() < deadline) {
		scratch[sink & 31] = work_leaf(200000);
		sink += scratch[(sink + 1) & 31];
	}
}

__attribute__((noinline)) void work_top(double seconds)
{
	work_mid(cpu_ns() + (uint64_t)(seconds * 1e9));
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
	struct sigaction sa = { .sa_handler = sig_handler };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGPROF, &sa, NULL);
	struct itimerval every = { .it_interval = { 0, 10000 }, .it_value = { 0, 10000 } };
	setitimer(ITIMER_PROF, &every, NULL);
	work_top(seconds);
	struct itimerval off = { 0 };
	setitimer(ITIMER_PROF, &off, NULL);
	printf("cpu_ns %llu\n", (unsigned long long)cpu_ns());
	return 0;
}
