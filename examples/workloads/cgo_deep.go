// Test workload for mixed Go/C stacks: a Go program (frame pointers)
// that spins alternately in a pure-Go chain (goLeaf <- goMid <- goTop <-
// main.main) and, through cgo, in C (cgo_c_leaf <- cgo_c_mid <- cgo_c_top,
// in libcgo_deep_lib.so built without frame pointers) called from
// callC <- main.main (cgo_deep_c.go). Built with CGO_ENABLED=0 it is pure
// Go (cgo_deep_pure.go: callC does nothing). receivers/tests/ebpf_unwind.rs
// builds all three files both ways.
//
// Protocol (as burn.c): prints "ready <pid>", waits for a line on stdin,
// spins argv[1] seconds of CPU time (default 3), prints
// "cpu_ns <process CPU time in ns>" and exits.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

var sink uint64

func cpuNs() uint64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return uint64(time.Duration(ru.Utime.Nano() + ru.Stime.Nano()))
}

// Where the Go side's samples land. The scratch array gives it a frame
// (Go keeps frame pointers in functions with a frame; a frameless leaf's
// caller is lost by any frame-pointer walk).
//
//go:noinline
func goLeaf(iters int) uint64 {
	var scratch [16]uint64
	x := sink
	for i := 0; i < iters; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		scratch[x&15] = x
	}
	return x + scratch[x&7]
}

//go:noinline
func goMid(rounds int) {
	for r := 0; r < rounds; r++ {
		sink += goLeaf(1000000)
	}
}

//go:noinline
func goTop(rounds int) {
	goMid(rounds)
	sink++
}

func main() {
	seconds := 3.0
	if len(os.Args) > 1 {
		if s, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			seconds = s
		}
	}
	fmt.Printf("ready %d\n", os.Getpid())
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		os.Exit(1)
	}
	deadline := cpuNs() + uint64(seconds*1e9)
	for cpuNs() < deadline {
		goTop(10)
		callC(10)
	}
	fmt.Printf("cpu_ns %d\n", cpuNs())
}
