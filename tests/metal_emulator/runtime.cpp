// The Metal emulator's scheduler (test-only; never part of the product): runs
// the .metal kernels compiled as C++ one fiber per GPU thread, 32-lane
// SIMD-groups whose shuffles are rendezvous of their lanes, threadgroup by
// threadgroup, and turns what real Metal would reject or get wrong into a
// command-buffer error. No C++ exception leaves this file: the Objective-C
// side (GCC's runtime) could not catch one.
//
// Fibers: a hand-rolled register switch on x86-64, ucontext elsewhere.
//
// Rules it enforces (each a hard failure with a message and a log line):
//   - >1024 threads per threadgroup (or over the pipeline's maximum);
//   - threadgroup memory (setThreadgroupMemoryLength + function-scope arrays)
//     over 32 KiB; a length not a multiple of 16;
//   - barrier divergence: a threadgroup_barrier that not every live thread of
//     the threadgroup reaches (some returned, or are at another barrier count);
//   - SIMD divergence: lanes of one SIMD-group at a shuffle while others wait
//     at a barrier, different SIMD ops at one rendezvous, a shuffle reading an
//     inactive lane;
//   - threadgroup write race (how a function-scope threadgroup array used as
//     per-thread storage shows): a byte of threadgroup memory changed by two
//     different threads with no barrier between. Detected by diffing the
//     threadgroup memory around each fiber's run segment, so a write of the
//     value already there is invisible (same-value writes cannot differ);
//   - concurrent-encoder hazard: two dispatches between the same barriers
//     whose byte ranges overlap with at least one write. Reads: from the bound
//     offset to the end of the buffer (loads are invisible; a CONST reads
//     sizeof(T)); writes: the extent of bytes the dispatch changed. Those
//     dispatches also run in a seeded shuffled order, as the GPU may;
//   - unbound [[buffer(n)]]/[[threadgroup(n)]], setBytes shorter than the
//     constant the kernel reads or over 4 KiB.
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "emu_runtime.h"
#include "muser_metal_emu_abi.h"
// The shim's hooks are set here; its address-space and `kernel` macros must not
// reach the C++ below.
#include "metal_shim.h"
#undef device
#undef constant
#undef threadgroup
#undef thread
#undef kernel

namespace {

constexpr size_t kSimdWidth = 32;
constexpr size_t kMaxThreadsPerThreadgroup = 1024;
constexpr size_t kMaxThreadgroupMemory = 32 * 1024;
constexpr size_t kMaxSetBytes = 4096;
constexpr size_t kFiberStack = 256 * 1024;
constexpr size_t kArenaBytes = 256 * 1024;  // room to keep running until an over-limit threadgroup yields

// ---------------- settings ----------------
struct Settings {
  uint64_t seed = 1;
  size_t page_size = 16384;  // Apple silicon
  size_t max_buffer_length = size_t(8) << 30;
  int os_major = 15, os_minor = 0;
  int no_device = 0;
  int allow_fast_math = 0;
  std::string injected_failure;
  bool has_injected_failure = false;
};
Settings& settings() {
  static Settings s;
  return s;
}
std::mutex& settings_mutex() {
  static std::mutex m;
  return m;
}
std::string& last_error() {
  static std::string s;
  return s;
}
std::vector<size_t>& last_order() {
  static std::vector<size_t> v;
  return v;
}

// ---------------- kernel registry ----------------
struct Kernel {
  std::string name;
  muser_emu_kernel_fn fn;
  std::vector<muser_emu_binding> bindings;
};
std::map<std::string, Kernel>& registry() {  // function-local: kernels register from static initializers
  static std::map<std::string, Kernel> r;
  return r;
}

std::string format(const char* fmt, va_list ap) {
  char buf[2048];
  vsnprintf(buf, sizeof buf, fmt, ap);
  return buf;
}

std::string fmt(const char* f, ...) {
  va_list ap;
  va_start(ap, f);
  std::string s = format(f, ap);
  va_end(ap);
  return s;
}

// ---------------- encoded work ----------------
struct Bound {
  bool set = false;
  bool is_bytes = false;
  void* contents = nullptr;  // the MTLBuffer's contents (not offset)
  size_t length = 0;         // the MTLBuffer's length
  size_t offset = 0;
  std::vector<uint8_t> bytes;  // setBytes copy (Metal copies at encode time)
  std::string label;
};

struct Dispatch {
  const Kernel* kernel = nullptr;
  size_t max_threads = kMaxThreadsPerThreadgroup;
  Bound buffers[MUSER_EMU_MAX_BINDINGS];
  size_t tg_length[MUSER_EMU_MAX_BINDINGS] = {};
  bool tg_set[MUSER_EMU_MAX_BINDINGS] = {};
  size_t count[3] = {1, 1, 1};
  size_t per_group[3] = {1, 1, 1};
  bool threads_mode = false;
  size_t encode_index = 0;
  std::string encode_error;  // found while encoding; reported when it would run
};

struct ByteRange {
  uintptr_t lo, hi;  // [lo, hi)
  bool write;
  size_t binding;
};

}  // namespace

struct muser_emu_encoder {
  bool concurrent = false;
  Dispatch state;                              // bindings persist between dispatches, as in Metal
  std::vector<std::vector<Dispatch>> intervals{1};  // split by memoryBarrierWithScope:
  size_t dispatches = 0;
  std::string error;  // first encode-time failure not tied to a dispatch
};

// ---------------- context switch ----------------
// x86-64: a hand-rolled switch of the callee-saved registers (no signal-mask
// syscall per switch, as swapcontext makes: ~10x faster on kernels that
// shuffle). Elsewhere: ucontext.
#if defined(__x86_64__) && defined(__linux__) && !defined(MUSER_EMU_UCONTEXT)
#define MUSER_EMU_ASM_SWITCH 1
extern "C" void muser_emu_ctx_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl muser_emu_ctx_switch
  .type muser_emu_ctx_switch, @function
muser_emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size muser_emu_ctx_switch, .-muser_emu_ctx_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

namespace {

// ---------------- fibers ----------------
enum class St { Ready, AtBarrier, AtSimd, Done };

struct Fiber {
#if MUSER_EMU_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
  muser_emu_thread args;
  St st = St::Ready;
  size_t barriers = 0;
  int simd_op = 0;
  uint32_t simd_value = 0, simd_arg = 0, simd_result = 0;
  size_t linear = 0;  // index in threadgroup
};

struct StackPool {
  std::vector<void*> stacks;
  void* get(size_t i) {
    while (stacks.size() <= i) {
      void* p = mmap(nullptr, kFiberStack + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (p == MAP_FAILED) return nullptr;
      mprotect(p, 4096, PROT_NONE);  // a kernel overflowing its stack faults instead of corrupting a neighbour
      stacks.push_back(p);
    }
    return static_cast<char*>(stacks[i]) + 4096;
  }
};

struct StaticArray {
  size_t offset, bytes;
  std::string name;
};

// One threadgroup's run; the hooks the kernels call find it through g_run.
struct GroupRun {
  const Dispatch* d = nullptr;
  std::vector<Fiber> fibers;
  size_t cur = 0;
#if MUSER_EMU_ASM_SWITCH
  void* sched_sp = nullptr;
#else
  ucontext_t sched;
#endif
  std::string error;
  // threadgroup memory: dynamic [[threadgroup(n)]] lengths, then function-scope arrays
  std::vector<uint8_t> arena, snapshot;
  size_t used = 0;
  std::map<const void*, StaticArray>* statics = nullptr;  // per dispatch: one layout for all threadgroups
  size_t* static_end = nullptr;
  std::vector<int32_t> last_writer;  // per byte: thread that changed it since the last barrier
  std::vector<std::string>* region_names = nullptr;
  std::vector<std::pair<size_t, size_t>>* regions = nullptr;
};
GroupRun* g_run = nullptr;
StackPool g_stacks;

void fail_run(const std::string& msg) {
  if (g_run && g_run->error.empty()) g_run->error = msg;
}

void yield_to_scheduler() {
  Fiber& f = g_run->fibers[g_run->cur];
#if MUSER_EMU_ASM_SWITCH
  muser_emu_ctx_switch(&f.sp, g_run->sched_sp);
#else
  swapcontext(&f.ctx, &g_run->sched);
#endif
}

void fiber_main() {
  GroupRun* r = g_run;
  Fiber& f = r->fibers[r->cur];
  r->d->kernel->fn(&f.args);
  r->fibers[r->cur].st = St::Done;
#if MUSER_EMU_ASM_SWITCH
  void* dead;
  muser_emu_ctx_switch(&dead, r->sched_sp);  // never resumed
  abort();
#endif  // ucontext: uc_link returns to the scheduler
}

void enter_fiber(GroupRun& r, Fiber& f) {
#if MUSER_EMU_ASM_SWITCH
  muser_emu_ctx_switch(&r.sched_sp, f.sp);
#else
  swapcontext(&r.sched, &f.ctx);
#endif
}

void init_fiber(GroupRun& r, Fiber& f, void* stack, size_t size) {
#if MUSER_EMU_ASM_SWITCH
  // the frame muser_emu_ctx_switch pops: mxcsr/x87 control word, r15..r12, rbx,
  // rbp, then fiber_main as the return address, 16-aligned as after a call
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  uint64_t* a = reinterpret_cast<uint64_t*>(top - 16);
  a[0] = reinterpret_cast<uint64_t>(&fiber_main);
  for (int i = 1; i <= 6; ++i) a[-i] = 0;
  uint32_t* csr = reinterpret_cast<uint32_t*>(a - 7);
  csr[0] = 0x1F80;  // MXCSR default: round to nearest, exceptions masked, no flush-to-zero
  csr[1] = 0x037F;  // x87 default control word
  f.sp = a - 7;
  (void)r;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack;
  f.ctx.uc_stack.ss_size = size;
  f.ctx.uc_link = &r.sched;
  makecontext(&f.ctx, fiber_main, 0);
#endif
}

void hook_barrier(metal::mem_flags) {
  if (!g_run) {
    muser_emu_fail("threadgroup_barrier called outside a dispatch");
    abort();
  }
  Fiber& f = g_run->fibers[g_run->cur];
  f.st = St::AtBarrier;
  yield_to_scheduler();
}

uint32_t hook_xor(uint32_t v, ushort m) { return muser_emu_simd(MUSER_EMU_SIMD_XOR, v, m); }
uint32_t hook_down(uint32_t v, ushort d) { return muser_emu_simd(MUSER_EMU_SIMD_DOWN, v, d); }

void install_hooks() {
  muser_metal_shim::hooks.simd_shuffle_xor = hook_xor;
  muser_metal_shim::hooks.simd_shuffle_down = hook_down;
  muser_metal_shim::hooks.threadgroup_barrier = hook_barrier;
}

const char* simd_op_name(int op) {
  switch (op) {
    case MUSER_EMU_SIMD_XOR: return "simd_shuffle_xor";
    case MUSER_EMU_SIMD_DOWN: return "simd_shuffle_down";
    case MUSER_EMU_SIMD_UP: return "simd_shuffle_up";
    case MUSER_EMU_SIMD_SHUFFLE: return "simd_shuffle";
    case MUSER_EMU_SIMD_SUM_F32: return "simd_sum";
    case MUSER_EMU_SIMD_SUM_I32: return "simd_sum";
    case MUSER_EMU_SIMD_MAX_F32: return "simd_max";
    case MUSER_EMU_SIMD_MIN_F32: return "simd_min";
  }
  return "simd op";
}

float as_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
uint32_t as_u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// Resolve the rendezvous of one SIMD-group: every active lane is at a SIMD op.
void resolve_simd(GroupRun& r, size_t sg, const std::vector<size_t>& lanes_idx) {
  Fiber* lane[kSimdWidth] = {};
  for (size_t i : lanes_idx) lane[r.fibers[i].linear % kSimdWidth] = &r.fibers[i];
  int op = 0;
  for (size_t l = 0; l < kSimdWidth; ++l) {
    if (!lane[l] || lane[l]->st != St::AtSimd) continue;
    if (!op) op = lane[l]->simd_op;
    if (lane[l]->simd_op != op) {
      fail_run(fmt("SIMD divergence: in SIMD-group %zu lanes meet at different SIMD ops (%s and %s)", sg,
                   simd_op_name(op), simd_op_name(lane[l]->simd_op)));
      return;
    }
  }
  auto active = [&](size_t l) { return l < kSimdWidth && lane[l] && lane[l]->st == St::AtSimd; };
  if (op == MUSER_EMU_SIMD_SUM_F32 || op == MUSER_EMU_SIMD_SUM_I32 || op == MUSER_EMU_SIMD_MAX_F32 ||
      op == MUSER_EMU_SIMD_MIN_F32) {
    // butterfly xor 16, 8, 4, 2, 1 over the active lanes (inactive ones are the identity)
    uint32_t v[kSimdWidth];
    bool has[kSimdWidth];
    for (size_t l = 0; l < kSimdWidth; ++l) {
      has[l] = active(l);
      v[l] = has[l] ? lane[l]->simd_value : 0;
    }
    for (size_t s = kSimdWidth / 2; s >= 1; s /= 2) {
      uint32_t nv[kSimdWidth];
      bool nh[kSimdWidth];
      for (size_t l = 0; l < kSimdWidth; ++l) {
        size_t o = l ^ s;
        nh[l] = has[l] || has[o];
        if (!has[l]) nv[l] = v[o];
        else if (!has[o]) nv[l] = v[l];
        else if (op == MUSER_EMU_SIMD_SUM_F32) nv[l] = as_u(as_f(v[l]) + as_f(v[o]));
        else if (op == MUSER_EMU_SIMD_SUM_I32) nv[l] = v[l] + v[o];
        else if (op == MUSER_EMU_SIMD_MAX_F32) nv[l] = as_u(std::max(as_f(v[l]), as_f(v[o])));
        else nv[l] = as_u(std::min(as_f(v[l]), as_f(v[o])));
      }
      memcpy(v, nv, sizeof v);
      memcpy(has, nh, sizeof has);
    }
    for (size_t l = 0; l < kSimdWidth; ++l)
      if (active(l)) lane[l]->simd_result = v[l];
  } else {
    for (size_t l = 0; l < kSimdWidth; ++l) {
      if (!active(l)) continue;
      Fiber& f = *lane[l];
      size_t src;
      switch (op) {
        case MUSER_EMU_SIMD_XOR: src = l ^ (f.simd_arg & (kSimdWidth - 1)); break;
        case MUSER_EMU_SIMD_DOWN: src = l + f.simd_arg; break;
        case MUSER_EMU_SIMD_UP: src = f.simd_arg > l ? kSimdWidth : l - f.simd_arg; break;
        default: src = f.simd_arg; break;
      }
      if ((op == MUSER_EMU_SIMD_DOWN || op == MUSER_EMU_SIMD_UP) && src >= kSimdWidth) {
        f.simd_result = f.simd_value;  // MSL: lanes shifted past the edge keep their value
        continue;
      }
      if (!active(src)) {
        fail_run(fmt("%s: lane %zu of SIMD-group %zu reads lane %zu, which is inactive (returned or outside the grid)",
                     simd_op_name(op), l, sg, src));
        return;
      }
      f.simd_result = lane[src]->simd_value;
    }
  }
  for (size_t l = 0; l < kSimdWidth; ++l)
    if (active(l)) lane[l]->st = St::Ready;
}

std::string region_of(const GroupRun& r, size_t off) {
  for (size_t i = 0; i < r.regions->size(); ++i) {
    auto [lo, hi] = (*r.regions)[i];
    if (off >= lo && off < hi) return fmt("%s, byte %zu", (*r.region_names)[i].c_str(), off - lo);
  }
  return fmt("byte %zu", off);
}

void run_segment(GroupRun& r, size_t i) {
  const size_t used = r.used;
  if (used) memcpy(r.snapshot.data(), r.arena.data(), used);
  r.cur = i;
  enter_fiber(r, r.fibers[i]);
  // an array first reached in this segment is poisoned in both copies, so its writes show too
  for (size_t b = 0; b < r.used; ++b) {
    if (r.arena[b] == r.snapshot[b]) continue;
    int32_t prev = r.last_writer[b];
    int32_t me = static_cast<int32_t>(r.fibers[i].linear);
    if (prev >= 0 && prev != me) {
      fail_run(fmt("threadgroup memory race: %s written by threads %d and %d of threadgroup %u with no "
                   "threadgroup_barrier between (a function-scope threadgroup array is shared by the whole "
                   "threadgroup, not per-thread storage)",
                   region_of(r, b).c_str(), prev, me, r.fibers[i].args.threadgroup_position_in_grid));
      return;
    }
    r.last_writer[b] = me;
  }
}

// Runs one threadgroup to the end; false with r.error set on a failure.
bool run_group(GroupRun& r) {
  const size_t n = r.fibers.size();
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = r.fibers[i];
    void* stack = g_stacks.get(i);
    if (!stack) {
      r.error = "could not map a fiber stack";
      return false;
    }
    init_fiber(r, f, stack, kFiberStack);
    f.st = St::Ready;
    f.barriers = 0;
  }
  const size_t nsg = (n + kSimdWidth - 1) / kSimdWidth;
  std::vector<std::vector<size_t>> sg_members(nsg);
  for (size_t i = 0; i < n; ++i) sg_members[r.fibers[i].linear / kSimdWidth].push_back(i);
  for (;;) {
    bool ran = false;
    for (size_t i = 0; i < n; ++i) {
      if (r.fibers[i].st != St::Ready) continue;
      run_segment(r, i);
      ran = true;
      if (!r.error.empty()) return false;
    }
    bool resolved = false;
    for (size_t sg = 0; sg < nsg; ++sg) {
      size_t at_simd = 0, at_barrier = 0;
      for (size_t i : sg_members[sg]) {
        at_simd += r.fibers[i].st == St::AtSimd;
        at_barrier += r.fibers[i].st == St::AtBarrier;
      }
      if (!at_simd) continue;
      if (at_barrier) {
        r.error = fmt("SIMD divergence: in SIMD-group %zu of threadgroup %u, %zu lanes wait at a SIMD op while %zu "
                      "wait at threadgroup_barrier",
                      sg, r.fibers[sg_members[sg][0]].args.threadgroup_position_in_grid, at_simd, at_barrier);
        return false;
      }
      resolve_simd(r, sg, sg_members[sg]);
      if (!r.error.empty()) return false;
      resolved = true;
    }
    if (ran || resolved) continue;
    size_t live = 0, at_barrier = 0, done = 0;
    size_t bmin = SIZE_MAX, bmax = 0;
    for (auto& f : r.fibers) {
      if (f.st == St::Done) {
        ++done;
        continue;
      }
      ++live;
      if (f.st == St::AtBarrier) {
        ++at_barrier;
        bmin = std::min(bmin, f.barriers);
        bmax = std::max(bmax, f.barriers);
      }
    }
    if (!live) break;
    if (at_barrier == live) {
      if (done) {
        r.error = fmt("barrier divergence: in threadgroup %u, %zu threads wait at threadgroup_barrier #%zu while %zu "
                      "threads of the threadgroup have returned without reaching it",
                      r.fibers[0].args.threadgroup_position_in_grid, at_barrier, bmin + 1, done);
        return false;
      }
      if (bmin != bmax) {
        r.error = fmt("barrier divergence: threads of threadgroup %u wait at different threadgroup_barrier calls "
                      "(#%zu and #%zu)",
                      r.fibers[0].args.threadgroup_position_in_grid, bmin + 1, bmax + 1);
        return false;
      }
      for (auto& f : r.fibers) {
        f.st = St::Ready;
        ++f.barriers;
      }
      std::fill(r.last_writer.begin(), r.last_writer.end(), -1);
      continue;
    }
    r.error = "scheduler stalled (a SIMD rendezvous that cannot complete)";
    return false;
  }
  // every thread returned: the barrier counts must agree (a thread that
  // skipped a barrier others passed would have been caught waiting above)
  return true;
}

std::string binding_desc(const muser_emu_binding& b) {
  const char* what = b.kind == MUSER_EMU_ARG_TG ? "threadgroup" : "buffer";
  return fmt("[[%s(%d)]] %s", what, b.index, b.name);
}

// Checks a dispatch can run; "" when it can.
std::string validate(const Dispatch& d) {
  if (!d.encode_error.empty()) return d.encode_error;
  if (!d.kernel) return "dispatch with no compute pipeline state set";
  const Kernel& k = *d.kernel;
  size_t threads = d.per_group[0] * d.per_group[1] * d.per_group[2];
  if (threads == 0) return fmt("%s: threadsPerThreadgroup has a zero dimension", k.name.c_str());
  if (threads > kMaxThreadsPerThreadgroup || threads > d.max_threads)
    return fmt("%s: %zu threads per threadgroup (%zux%zux%zu); the pipeline allows at most %zu", k.name.c_str(),
               threads, d.per_group[0], d.per_group[1], d.per_group[2],
               std::min(d.max_threads, kMaxThreadsPerThreadgroup));
  size_t tg_total = 0;
  for (auto& b : k.bindings) {
    if (b.kind >= MUSER_EMU_ARG_BUF_IN && b.kind <= MUSER_EMU_ARG_CONST) {
      const Bound& x = d.buffers[b.index];
      if (!x.set) return fmt("%s: %s is not bound", k.name.c_str(), binding_desc(b).c_str());
      size_t avail = x.is_bytes ? x.bytes.size() : x.length - x.offset;
      if (!x.is_bytes && x.offset > x.length)
        return fmt("%s: %s bound at offset %zu of a %zu-byte buffer", k.name.c_str(), binding_desc(b).c_str(),
                   x.offset, x.length);
      if (b.kind == MUSER_EMU_ARG_CONST && avail < b.size)
        return fmt("%s: %s reads %lu bytes; %zu are bound", k.name.c_str(), binding_desc(b).c_str(), b.size, avail);
    } else if (b.kind == MUSER_EMU_ARG_TG) {
      if (!d.tg_set[b.index])
        return fmt("%s: %s has no setThreadgroupMemoryLength:atIndex:%d", k.name.c_str(), binding_desc(b).c_str(),
                   b.index);
    }
  }
  for (size_t i = 0; i < MUSER_EMU_MAX_BINDINGS; ++i) tg_total += d.tg_set[i] ? d.tg_length[i] : 0;
  if (tg_total > kMaxThreadgroupMemory)
    return fmt("%s: %zu bytes of threadgroup memory set; the device allows %zu", k.name.c_str(), tg_total,
               kMaxThreadgroupMemory);
  return "";
}

struct Uid {
  size_t x, y, z;
};

// Runs one dispatch; "" when it ran clean.
std::string run_dispatch(const Dispatch& d, std::mt19937_64& rng) {
  std::string err = validate(d);
  if (!err.empty()) return err;
  const Kernel& k = *d.kernel;
  size_t groups[3], grid[3];
  for (int a = 0; a < 3; ++a) {
    if (d.threads_mode) {
      grid[a] = d.count[a];
      groups[a] = (d.count[a] + d.per_group[a] - 1) / d.per_group[a];
    } else {
      groups[a] = d.count[a];
      grid[a] = d.count[a] * d.per_group[a];
    }
  }
  const size_t ngroups = groups[0] * groups[1] * groups[2];
  if (ngroups == 0) return "";
  // threadgroups run in a shuffled order: they are unordered on the GPU
  std::vector<size_t> order(ngroups);
  for (size_t i = 0; i < ngroups; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);

  // threadgroup memory layout: [[threadgroup(n)]] regions (16-aligned), then arrays
  std::vector<std::pair<size_t, size_t>> regions;
  std::vector<std::string> region_names;
  size_t tg_off[MUSER_EMU_MAX_BINDINGS] = {};
  size_t dyn = 0;
  for (size_t i = 0; i < MUSER_EMU_MAX_BINDINGS; ++i) {
    if (!d.tg_set[i]) continue;
    tg_off[i] = dyn;
    regions.push_back({dyn, dyn + d.tg_length[i]});
    std::string nm = fmt("[[threadgroup(%zu)]]", i);
    for (auto& b : k.bindings)
      if (b.kind == MUSER_EMU_ARG_TG && size_t(b.index) == i) nm += std::string(" ") + b.name;
    region_names.push_back(nm);
    dyn += (d.tg_length[i] + 15) / 16 * 16;
  }
  std::map<const void*, StaticArray> statics;
  size_t static_end = dyn;

  GroupRun r;
  r.d = &d;
  r.arena.assign(kArenaBytes, 0);
  r.snapshot.assign(r.arena.size(), 0);
  r.last_writer.assign(r.arena.size(), -1);
  r.statics = &statics;
  r.static_end = &static_end;
  r.regions = &regions;
  r.region_names = &region_names;

  muser_emu_thread base{};
  for (auto& b : k.bindings) {
    if (b.kind >= MUSER_EMU_ARG_BUF_IN && b.kind <= MUSER_EMU_ARG_CONST) {
      const Bound& x = d.buffers[b.index];
      base.buffers[b.index] =
          x.is_bytes ? const_cast<uint8_t*>(x.bytes.data()) : static_cast<uint8_t*>(x.contents) + x.offset;
    }
  }
  for (size_t gi : order) {
    Uid g{gi % groups[0], (gi / groups[0]) % groups[1], gi / (groups[0] * groups[1])};
    size_t dims[3];
    for (int a = 0; a < 3; ++a) {
      size_t origin = (a == 0 ? g.x : a == 1 ? g.y : g.z) * d.per_group[a];
      dims[a] = std::min(d.per_group[a], grid[a] - origin);  // dispatchThreads: edge groups are smaller
    }
    const size_t n = dims[0] * dims[1] * dims[2];
    r.fibers.assign(n, Fiber{});
    r.used = static_end;
    r.error.clear();
    // uninitialized threadgroup memory reads as NaN; beyond static_end it is poisoned when allocated
    memset(r.arena.data(), 0xff, static_end);
    memset(r.snapshot.data(), 0xff, static_end);
    std::fill(r.last_writer.begin(), r.last_writer.end(), -1);
    for (size_t t = 0; t < n; ++t) {
      Fiber& f = r.fibers[t];
      f.linear = t;
      f.args = base;
      for (size_t i = 0; i < MUSER_EMU_MAX_BINDINGS; ++i)
        if (d.tg_set[i]) f.args.tg_memory[i] = r.arena.data() + tg_off[i];
      size_t lx = t % dims[0];
      f.args.thread_position_in_threadgroup = static_cast<unsigned>(lx);
      f.args.thread_position_in_grid = static_cast<unsigned>(g.x * d.per_group[0] + lx);
      f.args.threadgroup_position_in_grid = static_cast<unsigned>(g.x);
      f.args.threads_per_threadgroup = static_cast<unsigned>(dims[0]);
      f.args.threadgroups_per_grid = static_cast<unsigned>(groups[0]);
      f.args.thread_index_in_simdgroup = static_cast<unsigned>(t % kSimdWidth);
      f.args.simdgroup_index_in_threadgroup = static_cast<unsigned>(t / kSimdWidth);
    }
    g_run = &r;
    bool ok = run_group(r);
    g_run = nullptr;
    if (!ok) return fmt("%s: %s", k.name.c_str(), r.error.c_str());
  }
  return "";
}

void collect_ranges(const Dispatch& d, const std::vector<std::vector<uint8_t>>& before,
                    const std::vector<size_t>& out_bindings, std::vector<ByteRange>& out) {
  for (auto& b : d.kernel->bindings) {
    if (b.kind < MUSER_EMU_ARG_BUF_IN || b.kind > MUSER_EMU_ARG_CONST) continue;
    const Bound& x = d.buffers[b.index];
    if (x.is_bytes) continue;
    uintptr_t lo = reinterpret_cast<uintptr_t>(x.contents) + x.offset;
    uintptr_t end = reinterpret_cast<uintptr_t>(x.contents) + x.length;
    if (b.kind == MUSER_EMU_ARG_CONST) out.push_back({lo, std::min(end, lo + b.size), false, size_t(b.index)});
    if (b.kind == MUSER_EMU_ARG_BUF_IN || b.kind == MUSER_EMU_ARG_BUF_INOUT)
      out.push_back({lo, end, false, size_t(b.index)});
  }
  for (size_t j = 0; j < out_bindings.size(); ++j) {
    const Bound& x = d.buffers[out_bindings[j]];
    const uint8_t* now = static_cast<const uint8_t*>(x.contents) + x.offset;
    const std::vector<uint8_t>& was = before[j];
    size_t first = SIZE_MAX, last = 0;
    for (size_t i = 0; i < was.size(); ++i)
      if (now[i] != was[i]) {
        first = std::min(first, i);
        last = i;
      }
    if (first != SIZE_MAX) {
      // whole elements: a float written over one that shares its low bytes still counts from its first byte
      size_t elem = 1;
      for (auto& b : d.kernel->bindings)
        if (size_t(b.index) == out_bindings[j] && b.kind != MUSER_EMU_ARG_TG && b.size) elem = b.size;
      first = first / elem * elem;
      last = std::min(was.size(), (last / elem + 1) * elem);
      uintptr_t lo = reinterpret_cast<uintptr_t>(now);
      out.push_back({lo + first, lo + last, true, out_bindings[j]});
    }
  }
}

}  // namespace

// ---------------- C interface ----------------
extern "C" {

int muser_emu_register_kernel(const char* name, muser_emu_kernel_fn fn, const muser_emu_binding* b,
                              unsigned long n) {
  Kernel k{name, fn, std::vector<muser_emu_binding>(b, b + n)};
  registry()[name] = k;
  return 0;
}

const void* muser_emu_find_kernel(const char* name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : &it->second;
}

void* muser_emu_threadgroup_array(const void* site, unsigned long bytes, unsigned long align, const char* name) {
  static std::vector<std::vector<uint8_t>> overflow;  // only on an over-limit path that already failed
  if (!g_run) {
    muser_emu_fail("threadgroup array %s used outside a dispatch", name);
    abort();
  }
  GroupRun& r = *g_run;
  auto it = r.statics->find(site);
  if (it == r.statics->end()) {
    size_t off = (*r.static_end + align - 1) / align * align;
    if (off + bytes > kMaxThreadgroupMemory) {
      fail_run(fmt("%lu bytes of threadgroup array %s bring threadgroup memory to %zu bytes; the device allows %zu",
                   bytes, name, off + bytes, kMaxThreadgroupMemory));
      if (off + bytes > r.arena.size()) {
        overflow.emplace_back(bytes + align, 0xff);
        return overflow.back().data();
      }
    }
    memset(r.arena.data() + off, 0xff, bytes);
    memset(r.snapshot.data() + off, 0xff, bytes);
    it = r.statics->emplace(site, StaticArray{off, bytes, name}).first;
    *r.static_end = off + bytes;
    r.regions->push_back({off, off + bytes});
    r.region_names->push_back(std::string("threadgroup array ") + name);
  }
  r.used = std::max(r.used, std::min(*r.static_end, r.arena.size()));
  return r.arena.data() + it->second.offset;
}

unsigned int muser_emu_simd(int op, unsigned int value, unsigned int arg) {
  if (!g_run) {
    muser_emu_fail("%s called outside a dispatch", simd_op_name(op));
    abort();
  }
  Fiber& f = g_run->fibers[g_run->cur];
  f.simd_op = op;
  f.simd_value = value;
  f.simd_arg = arg;
  f.st = St::AtSimd;
  yield_to_scheduler();
  return g_run->fibers[g_run->cur].simd_result;
}

void muser_emu_fail(const char* f, ...) {
  va_list ap;
  va_start(ap, f);
  std::string s = format(f, ap);
  va_end(ap);
  {
    std::lock_guard<std::mutex> g(settings_mutex());
    last_error() = s;
  }
  fprintf(stderr, "muser metal emulator: error: %s\n", s.c_str());
}

const char* muser_metal_emu_last_error(void) { return last_error().c_str(); }

size_t muser_metal_emu_last_order(size_t* out, size_t cap) {
  const auto& v = last_order();
  for (size_t i = 0; i < v.size() && i < cap; ++i) out[i] = v[i];
  return v.size();
}

void muser_metal_emu_reset(void) {
  std::lock_guard<std::mutex> g(settings_mutex());
  settings() = Settings{};
  last_error().clear();
}

void muser_emu_load_environment(void) {
  static std::once_flag once;
  std::call_once(once, [] {
    install_hooks();
    Settings& s = settings();
    if (const char* v = getenv("MUSER_METAL_EMU_SEED")) s.seed = strtoull(v, nullptr, 0);
    if (const char* v = getenv("MUSER_METAL_EMU_PAGE_SIZE")) s.page_size = strtoull(v, nullptr, 0);
    if (const char* v = getenv("MUSER_METAL_EMU_MAX_BUFFER_LENGTH")) s.max_buffer_length = strtoull(v, nullptr, 0);
    if (const char* v = getenv("MUSER_METAL_EMU_MACOS")) sscanf(v, "%d.%d", &s.os_major, &s.os_minor);
    if (const char* v = getenv("MUSER_METAL_EMU_NO_DEVICE")) s.no_device = atoi(v);
    if (const char* v = getenv("MUSER_METAL_EMU_ALLOW_FAST_MATH")) s.allow_fast_math = atoi(v);
  });
}

void muser_metal_emu_set_seed(uint64_t seed) { settings().seed = seed; }
void muser_metal_emu_set_page_size(size_t bytes) { settings().page_size = bytes; }
void muser_metal_emu_set_max_buffer_length(size_t bytes) { settings().max_buffer_length = bytes; }
void muser_metal_emu_set_os_version(int major, int minor) {
  settings().os_major = major;
  settings().os_minor = minor;
}
int muser_metal_emu_os_available(const char* version) {
  int major = 0, minor = 0;
  sscanf(version, "%d.%d", &major, &minor);
  const Settings& s = settings();
  return s.os_major > major || (s.os_major == major && s.os_minor >= minor);
}
void muser_metal_emu_set_no_device(int v) { settings().no_device = v; }
void muser_metal_emu_set_allow_fast_math(int v) { settings().allow_fast_math = v; }
void muser_metal_emu_fail_next_command_buffer(const char* message) {
  std::lock_guard<std::mutex> g(settings_mutex());
  settings().injected_failure = message ? message : "";
  settings().has_injected_failure = message != nullptr;
}
int muser_emu_take_injected_failure(char* msg, size_t cap) {
  std::lock_guard<std::mutex> g(settings_mutex());
  if (!settings().has_injected_failure) return 0;
  snprintf(msg, cap, "%s", settings().injected_failure.c_str());
  settings().has_injected_failure = false;
  return 1;
}
uint64_t muser_emu_seed(void) { return settings().seed; }
size_t muser_emu_page_size(void) { return settings().page_size; }
size_t muser_emu_max_buffer_length(void) { return settings().max_buffer_length; }
int muser_emu_no_device(void) { return settings().no_device; }
int muser_emu_allow_fast_math(void) { return settings().allow_fast_math; }

muser_emu_encoder* muser_emu_encoder_new(int concurrent) {
  auto* e = new muser_emu_encoder;
  e->concurrent = concurrent != 0;
  return e;
}
void muser_emu_encoder_free(muser_emu_encoder* e) { delete e; }

static bool index_ok(muser_emu_encoder* e, size_t index, const char* what) {
  if (index < MUSER_EMU_MAX_BINDINGS) return true;
  if (e->error.empty()) e->error = fmt("%s at index %zu; Metal has indices 0..%d", what, index, MUSER_EMU_MAX_BINDINGS - 1);
  return false;
}

void muser_emu_encoder_set_kernel(muser_emu_encoder* e, const void* kernel, size_t max_threads) {
  e->state.kernel = static_cast<const Kernel*>(kernel);
  e->state.max_threads = max_threads;
}

void muser_emu_encoder_set_buffer(muser_emu_encoder* e, size_t index, void* contents, size_t length, size_t offset,
                                  const char* label) {
  if (!index_ok(e, index, "setBuffer")) return;
  Bound& b = e->state.buffers[index];
  b = Bound{};
  b.set = contents != nullptr;
  b.contents = contents;
  b.length = length;
  b.offset = offset;
  b.label = label ? label : "";
}

void muser_emu_encoder_set_bytes(muser_emu_encoder* e, size_t index, const void* bytes, size_t length) {
  if (!index_ok(e, index, "setBytes")) return;
  if (length > kMaxSetBytes && e->error.empty())
    e->error = fmt("setBytes:length:%zu at index %zu; Metal allows at most %zu bytes (use a buffer)", length, index,
                   kMaxSetBytes);
  Bound& b = e->state.buffers[index];
  b = Bound{};
  b.set = true;
  b.is_bytes = true;
  b.bytes.assign(static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + length);
  b.label = "setBytes";
}

void muser_emu_encoder_set_threadgroup_length(muser_emu_encoder* e, size_t index, size_t length) {
  if (!index_ok(e, index, "setThreadgroupMemoryLength")) return;
  if (length % 16 && e->error.empty())
    e->error = fmt("setThreadgroupMemoryLength:%zu atIndex:%zu; Metal wants a multiple of 16 bytes", length, index);
  e->state.tg_length[index] = length;
  e->state.tg_set[index] = true;
}

void muser_emu_encoder_dispatch(muser_emu_encoder* e, const size_t count[3], const size_t per_group[3],
                                int threads_mode) {
  Dispatch d = e->state;
  for (int a = 0; a < 3; ++a) {
    d.count[a] = count[a];
    d.per_group[a] = per_group[a];
  }
  d.threads_mode = threads_mode != 0;
  d.encode_index = e->dispatches++;
  d.encode_error = e->error;
  e->intervals.back().push_back(std::move(d));
}

void muser_emu_encoder_barrier(muser_emu_encoder* e) {
  if (!e->intervals.back().empty()) e->intervals.emplace_back();
}

int muser_emu_encoder_run(muser_emu_encoder* e, char* msg, size_t cap) {
  static std::mutex run_mutex;  // one scheduler: fibers and hooks are global
  std::lock_guard<std::mutex> g(run_mutex);
  install_hooks();
  std::mt19937_64 rng(settings().seed);
  if (!e->error.empty() && e->dispatches == 0) {
    snprintf(msg, cap, "%s", e->error.c_str());
    return 1;  // MTLCommandBufferErrorInternal: the emulator's checks have no Metal code of their own
  }
  for (auto& interval : e->intervals) {
    std::vector<size_t> order(interval.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (e->concurrent) std::shuffle(order.begin(), order.end(), rng);  // no barrier: no order
    last_order().clear();
    for (size_t i : order) last_order().push_back(interval[i].encode_index);
    std::vector<std::vector<ByteRange>> ranges(interval.size());
    for (size_t i : order) {
      const Dispatch& d = interval[i];
      std::vector<size_t> outs;
      std::vector<std::vector<uint8_t>> before;
      if (e->concurrent && d.kernel && validate(d).empty()) {
        for (auto& b : d.kernel->bindings) {
          if (b.kind != MUSER_EMU_ARG_BUF_OUT && b.kind != MUSER_EMU_ARG_BUF_INOUT) continue;
          if (std::find(outs.begin(), outs.end(), size_t(b.index)) != outs.end()) continue;
          const Bound& x = d.buffers[b.index];
          const uint8_t* p = static_cast<const uint8_t*>(x.contents) + x.offset;
          outs.push_back(b.index);
          before.emplace_back(p, p + (x.length - x.offset));
        }
      }
      std::string err = run_dispatch(d, rng);
      if (!err.empty()) {
        snprintf(msg, cap, "dispatch #%zu %s", d.encode_index, err.c_str());
        return 1;
      }
      if (e->concurrent) collect_ranges(d, before, outs, ranges[i]);
    }
    if (!e->concurrent) continue;
    for (size_t i = 0; i < interval.size(); ++i)
      for (size_t j = i + 1; j < interval.size(); ++j)
        for (auto& a : ranges[i])
          for (auto& b : ranges[j]) {
            if (!a.write && !b.write) continue;
            uintptr_t lo = std::max(a.lo, b.lo), hi = std::min(a.hi, b.hi);
            if (lo >= hi) continue;
            const Dispatch& da = interval[i];
            const Dispatch& db = interval[j];
            const Bound& xa = da.buffers[a.binding];
            uintptr_t base = reinterpret_cast<uintptr_t>(xa.contents);
            snprintf(msg, cap,
                     "hazard: dispatches #%zu (%s, %s [[buffer(%zu)]]) and #%zu (%s, %s [[buffer(%zu)]]) of one "
                     "concurrent encoder touch bytes [%zu, %zu) of buffer '%s' with no memoryBarrierWithScope: "
                     "between them",
                     da.encode_index, da.kernel->name.c_str(), a.write ? "writes" : "reads", a.binding,
                     db.encode_index, db.kernel->name.c_str(), b.write ? "writes" : "reads", b.binding,
                     size_t(lo - base), size_t(hi - base), xa.label.c_str());
            return 1;
          }
  }
  return 0;
}

}  // extern "C"
