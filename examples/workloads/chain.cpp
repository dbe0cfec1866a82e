// A CPU-bound C++ call chain for the user_symbols tests (demangling,
// inlined frames): main -> work::outer_loop -> work::Acc<unsigned long>::middle
// -> work::Acc<unsigned long>::leaf<Mixer> with Mixer::mix inlined. Waits
// for a line on stdin, then runs for argv[1] seconds (default 1.5).
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace work {
volatile unsigned long sink;

struct Mixer {
    static inline __attribute__((always_inline)) unsigned long mix(unsigned long x) {
        x ^= x >> 13;
        x *= 0x9E3779B97F4A7C15UL;
        return x ^ (x >> 7);
    }
};

__attribute__((noinline)) void tick() { __asm__ volatile(""); }

template <typename T> struct Acc {
    T total = 0;
    template <typename M> __attribute__((noinline)) T leaf(T n) {
        T s = 0;
        for (T i = 0; i < n; i++) {
            s += M::mix(i + s);
            if ((i & 1023) == 0)
                tick();
        }
        total += s;
        sink = s;
        return s;
    }
    __attribute__((noinline)) T middle(T n) {
        T r = leaf<Mixer>(n);
        sink += r;
        return r + 1;
    }
};

__attribute__((noinline)) unsigned long outer_loop(double seconds) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    Acc<unsigned long> acc;
    unsigned long r = 0;
    while (std::chrono::steady_clock::now() < end)
        r += acc.middle(100000);
    sink += r;
    return r + acc.total;
}
} // namespace work

int main(int argc, char **argv) {
    char line[16];
    double seconds = argc > 1 ? std::atof(argv[1]) : 1.5;
    if (!std::fgets(line, sizeof line, stdin))
        return 1;
    work::outer_loop(seconds);
    return 0;
}
