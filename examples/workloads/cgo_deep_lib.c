// The C half of cgo_deep.go (mixed Go/C stacks): a library built
// `-O2 -fomit-frame-pointer -shared -fPIC` (walked with its .eh_frame
// table) that spins in cgo_c_leaf <- cgo_c_mid <- cgo_c_top, called from
// Go through cgo.
#include <stdint.h>

volatile uint64_t cgo_c_sink;

// Where the C side's samples land: a frameless leaf.
__attribute__((noinline)) uint64_t cgo_c_leaf(uint64_t iters)
{
	uint64_t x = cgo_c_sink;
	for (uint64_t i = 0; i < iters; i++)
		x = x * 6364136223846793005ull + 1442695040888963407ull;
	return x;
}

// A frame with locals; the use after the call keeps it from being a tail call.
__attribute__((noinline)) void cgo_c_mid(uint64_t rounds)
{
	volatile uint64_t scratch[32];
	for (uint64_t r = 0; r < rounds; r++) {
		scratch[cgo_c_sink & 31] = cgo_c_leaf(1000000);
		cgo_c_sink += scratch[(cgo_c_sink + 1) & 31];
	}
}

__attribute__((noinline)) void cgo_c_top(uint64_t rounds)
{
	cgo_c_mid(rounds);
	cgo_c_sink++;
}
