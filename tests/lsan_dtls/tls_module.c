/* A module with 8 bytes of thread-local storage. Loaded with dlopen and no
 * static TLS to spare, glibc gives each thread its block on first use, with
 * malloc(8): under ASan, a chunk of the 32-byte class (see guess_trap.c). */
__thread long tls_word;

long *tls_word_address(void) { return &tls_word; }
