// Syscall-heavy test workload for the ebpf receiver: reads /dev/zero in a
// loop so most samples land in the kernel (read → iov_iter_zero/clear_user).
//
//     cc -O1 -g -fno-omit-frame-pointer -o readzero readzero.c
//
// Same protocol as burn.c: "ready <pid>", wait for a line, run argv[1]
// seconds, print "cpu_ns <n>".
#include <fcntl.h>
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

static char buf[1 << 16];

__attribute__((noinline)) void profcol_read_zero(int fd, double seconds)
{
	uint64_t deadline = now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
	while (now_ns(CLOCK_MONOTONIC) < deadline)
		for (int i = 0; i < 64; i++)
			if (read(fd, buf, sizeof buf) < 0)
				exit(2);
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 3.0;
	char line[64];
	int fd = open("/dev/zero", O_RDONLY);

	if (fd < 0)
		return 2;
	setvbuf(stdout, NULL, _IONBF, 0);
	printf("ready %ld\n", (long)getpid());
	if (!fgets(line, sizeof line, stdin))
		return 1;
	uint64_t cpu0 = now_ns(CLOCK_PROCESS_CPUTIME_ID);
	profcol_read_zero(fd, seconds);
	printf("cpu_ns %llu\n", (unsigned long long)(now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0));
	return 0;
}
