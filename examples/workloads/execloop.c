// Execs PROGRAM (with ARG, when given) RATE times a second for SECONDS
// seconds, reaping children as they exit (they may overlap): the exec load
// of the uprobe CPU bench.
//
//   execloop PROGRAM RATE SECONDS [ARG]     prints `execs <n>` at the end
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: execloop PROGRAM RATE SECONDS [ARG]\n");
		return 2;
	}
	long rate = atol(argv[2]), seconds = atol(argv[3]);
	if (rate <= 0 || seconds <= 0)
		return 2;
	long period_ns = 1000000000L / rate;
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	long n = 0;
	for (long i = 0; i < rate * seconds; i++) {
		pid_t pid = fork();
		if (pid == 0) {
			execl(argv[1], argv[1], argc == 5 ? argv[4] : (char *)NULL, (char *)NULL);
			_exit(127);
		}
		if (pid > 0)
			n++;
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		next.tv_nsec += period_ns;
		while (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
	while (wait(NULL) > 0)
		;
	printf("execs %ld\n", n);
	return 0;
}
