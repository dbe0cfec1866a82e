// Lives argv[1] milliseconds (default 0) and exits: a short-lived process
// to exec many times (the uprobe negative-cache test strips it).
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long ms = argc > 1 ? atol(argv[1]) : 0;
	if (ms > 0)
		usleep(ms * 1000);
	return 0;
}
