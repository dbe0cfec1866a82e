/* A C program with one function inlined into another: the user_symbols
   and profcol-elf tests compare its frames with binutils' addr2line. */
volatile int sink;
static inline __attribute__((always_inline)) int inner(int x) {
    sink += x * 3;
    return sink + 1;
}
__attribute__((noinline)) int outer(int x) {
    int s = 0;
    for (int i = 0; i < x; i++)
        s += inner(i);
    return s;
}
int main(int argc, char **argv) { (void)argv; return outer(argc) == 42; }
