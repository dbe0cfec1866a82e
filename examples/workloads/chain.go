// A CPU-bound call chain for the user_symbols tests (Go's pclntab):
// main -> outerLoop -> middle -> (*acc).leafWork, with mix inlined into
// leafWork by the compiler (leafWork calls tick now and then). Waits for
// a line on stdin, then runs for argv[1] seconds (default 1.5) and exits.
package main

import (
	"bufio"
	"os"
	"strconv"
	"time"
)

var sink uint64

type acc struct{ total uint64 }

func mix(x uint64) uint64 {
	x ^= x >> 13
	x *= 0x9E3779B97F4A7C15
	return x ^ (x >> 7)
}

// tick gives leafWork a call, so it keeps a frame pointer (Go leaves
// small leaf functions frameless, and a frame-pointer walk then skips
// their caller).
//
//go:noinline
func tick() {}

//go:noinline
func (a *acc) leafWork(n uint64) uint64 {
	var s uint64
	for i := uint64(0); i < n; i++ {
		s += mix(i + s)
		if i&1023 == 0 {
			tick()
		}
	}
	a.total += s
	return s
}

//go:noinline
func middle(a *acc, n uint64) uint64 {
	r := a.leafWork(n)
	sink += r
	return r + 1
}

//go:noinline
func outerLoop(seconds float64) uint64 {
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	a := &acc{}
	var r uint64
	for time.Now().Before(end) {
		r += middle(a, 100000)
	}
	return r + a.total
}

func main() {
	seconds := 1.5
	if len(os.Args) > 1 {
		if s, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			seconds = s
		}
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		os.Exit(1)
	}
	sink += outerLoop(seconds)
}
