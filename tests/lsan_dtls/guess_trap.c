/* Does LeakSanitizer, run with CI's options, survive a dynamic TLS block that
 * starts 16 bytes past a page boundary?
 *
 * GCC 12's libasan records each dynamic TLS block it sees in __tls_get_addr.
 * When the block is not the static TLS and its address is 16 mod 4096, it
 * guesses glibc 2.19's block header and reads the block's start and size from
 * the 16 bytes before it. Under ASan those bytes are the chunk's own header,
 * so the recorded "start" is the allocating stack's id (a small number) and
 * the "size" is huge, and the exit-time leak scan faults there ("Tracer
 * caught signal 11: addr=0x1420" in CI on 2026-12-04, where a plot test's
 * 8-byte TLS block happened to land so). intercept_tls_get_addr=0 turns the
 * recording off; the blocks stay roots of the scan as allocations made by the
 * dynamic linker (LeakSanitizer's use_ld_allocations).
 *
 * This program arms the trap on purpose: it finds a malloc(8) chunk 16 bytes
 * past a page, frees it (no quarantine, so the next malloc(8) gets it back),
 * then touches the module's TLS so that glibc allocates the block there.
 * Exit 0: the block landed on the trap and the process got through its leak
 * scan. Exit 4: the trap was not armed (the check proved nothing). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { kMaxTries = 100000 };

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s path/to/libtls_module.so\n", argv[0]);
    return 2;
  }
  void *module = dlopen(argv[1], RTLD_NOW);
  if (!module) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 3;
  }
  long *(*tls_word_address)(void) = (long *(*)(void))dlsym(module, "tls_word_address");
  if (!tls_word_address) {
    fprintf(stderr, "dlsym: %s\n", dlerror());
    return 3;
  }
  static void *held[kMaxTries];
  int n_held = 0;
  void *trap = NULL;
  while (n_held < kMaxTries) {
    void *chunk = malloc(8);
    if (((uintptr_t)chunk & 4095) == 16) {
      trap = chunk;
      break;
    }
    held[n_held++] = chunk;
  }
  if (!trap) {
    fprintf(stderr, "no malloc(8) chunk 16 bytes past a page in %d tries\n", kMaxTries);
    return 4;
  }
  free(trap);
  long *block = tls_word_address(); /* glibc allocates the block here */
  *block = 1;
  for (int i = 0; i < n_held; ++i) free(held[i]);
  if (block != trap) {
    fprintf(stderr, "the TLS block %p did not land on the trap %p\n", (void *)block, trap);
    return 4;
  }
  fprintf(stderr, "the TLS block is at %p, 16 bytes past a page; now the leak scan\n", (void *)block);
  return 0;
}
