//go:build cgo

// The cgo half of cgo_deep.go: callC calls into libcgo_deep_lib.so.
package main

/*
#cgo LDFLAGS: -lcgo_deep_lib
#include <stdint.h>
void cgo_c_top(uint64_t rounds);
*/
import "C"

//go:noinline
func callC(rounds int) {
	C.cgo_c_top(C.uint64_t(rounds))
	sink++
}
