// How a muser Metal kernel declares itself: its name, its arguments and their
// bindings, written once with these macros instead of MSL attributes, so that
//   - on Metal they expand to the MSL signature (`kernel void name(device const
//     float* x [[buffer(0)]], ..., uint gid [[thread_position_in_grid]])`);
//   - compiled as C++ for the test-only emulator (MUSER_METAL_EMULATOR, on top
//     of tests/metal_shim/) they expand to the same function plus a binding
//     table and a registration by name: what a C++ compiler would otherwise
//     drop with the attributes, and what the emulator needs to bind buffers,
//     fill thread positions and tell reads from writes for its hazard check.
// (The shim defines __METAL_VERSION__, so MUSER_METAL_EMULATOR decides.)
//
//   MUSER_KERNEL(matvec_f32_f32,
//                MUSER_ARG_BUFFER_IN(float, w, 0),      // device const float* w [[buffer(0)]]
//                MUSER_ARG_BUFFER_OUT(float, y, 1),     // device float* y       [[buffer(1)]]  (written)
//                MUSER_ARG_CONSTANT(MatvecKargs, k, 2), // constant MatvecKargs& k [[buffer(2)]]
//                MUSER_ARG_THREADGROUP(float, part, 0), // threadgroup float* part [[threadgroup(0)]]
//                MUSER_ARG_TGID(row), MUSER_ARG_LANE(lane)) { ...body... }
//
// Buffer kinds: _IN is read only, _OUT is written (and may be read), _INOUT
// read and written. Thread attributes are `uint` (the x component, as MSL
// gives a scalar attribute). At most 16 arguments.
// A threadgroup array at function scope is MUSER_THREADGROUP_ARRAY(type, name,
// count): `threadgroup type name[count]` on Metal; on the emulator a pointer to
// the same per-threadgroup storage for every thread (so sizeof(name) differs).
#pragma once

// ---- argument descriptors: (kind, type, name, index) tuples ----
#define MUSER_ARG_BUFFER_IN(type, name, index) (BUF_IN, type, name, index)
#define MUSER_ARG_BUFFER_OUT(type, name, index) (BUF_OUT, type, name, index)
#define MUSER_ARG_BUFFER_INOUT(type, name, index) (BUF_INOUT, type, name, index)
#define MUSER_ARG_CONSTANT(type, name, index) (CONST, type, name, index)
#define MUSER_ARG_THREADGROUP(type, name, index) (TG, type, name, index)
#define MUSER_ARG_TID(name) (TID, uint, name, 0)      // thread_position_in_grid
#define MUSER_ARG_TGID(name) (TGID, uint, name, 0)    // threadgroup_position_in_grid
#define MUSER_ARG_TPTG(name) (TPTG, uint, name, 0)    // thread_position_in_threadgroup
#define MUSER_ARG_NTPTG(name) (NTPTG, uint, name, 0)  // threads_per_threadgroup
#define MUSER_ARG_NTGPG(name) (NTGPG, uint, name, 0)  // threadgroups_per_grid
#define MUSER_ARG_LANE(name) (LANE, uint, name, 0)    // thread_index_in_simdgroup
#define MUSER_ARG_SGID(name) (SGID, uint, name, 0)    // simdgroup_index_in_threadgroup

// ---- a small preprocessor map over up to 16 tuples, comma separated ----
#define MUSER_KABI_CAT_(a, b) a##b
#define MUSER_KABI_CAT(a, b) MUSER_KABI_CAT_(a, b)
#define MUSER_KABI_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, n, ...) n
#define MUSER_KABI_NARGS(...) \
  MUSER_KABI_NARGS_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define MUSER_KABI_MAP_1(m, a) m a
#define MUSER_KABI_MAP_2(m, a, ...) m a, MUSER_KABI_MAP_1(m, __VA_ARGS__)
#define MUSER_KABI_MAP_3(m, a, ...) m a, MUSER_KABI_MAP_2(m, __VA_ARGS__)
#define MUSER_KABI_MAP_4(m, a, ...) m a, MUSER_KABI_MAP_3(m, __VA_ARGS__)
#define MUSER_KABI_MAP_5(m, a, ...) m a, MUSER_KABI_MAP_4(m, __VA_ARGS__)
#define MUSER_KABI_MAP_6(m, a, ...) m a, MUSER_KABI_MAP_5(m, __VA_ARGS__)
#define MUSER_KABI_MAP_7(m, a, ...) m a, MUSER_KABI_MAP_6(m, __VA_ARGS__)
#define MUSER_KABI_MAP_8(m, a, ...) m a, MUSER_KABI_MAP_7(m, __VA_ARGS__)
#define MUSER_KABI_MAP_9(m, a, ...) m a, MUSER_KABI_MAP_8(m, __VA_ARGS__)
#define MUSER_KABI_MAP_10(m, a, ...) m a, MUSER_KABI_MAP_9(m, __VA_ARGS__)
#define MUSER_KABI_MAP_11(m, a, ...) m a, MUSER_KABI_MAP_10(m, __VA_ARGS__)
#define MUSER_KABI_MAP_12(m, a, ...) m a, MUSER_KABI_MAP_11(m, __VA_ARGS__)
#define MUSER_KABI_MAP_13(m, a, ...) m a, MUSER_KABI_MAP_12(m, __VA_ARGS__)
#define MUSER_KABI_MAP_14(m, a, ...) m a, MUSER_KABI_MAP_13(m, __VA_ARGS__)
#define MUSER_KABI_MAP_15(m, a, ...) m a, MUSER_KABI_MAP_14(m, __VA_ARGS__)
#define MUSER_KABI_MAP_16(m, a, ...) m a, MUSER_KABI_MAP_15(m, __VA_ARGS__)
#define MUSER_KABI_MAP(m, ...) MUSER_KABI_CAT(MUSER_KABI_MAP_, MUSER_KABI_NARGS(__VA_ARGS__))(m, __VA_ARGS__)

// the parameter as the kernel body sees it (same on both sides)
#define MUSER_KABI_PARAM(kind, type, name, index) MUSER_KABI_CAT(MUSER_KABI_PARAM_, kind)(type, name)
#define MUSER_KABI_PARAM_BUF_IN(type, name) device const type* name
#define MUSER_KABI_PARAM_BUF_OUT(type, name) device type* name
#define MUSER_KABI_PARAM_BUF_INOUT(type, name) device type* name
#define MUSER_KABI_PARAM_CONST(type, name) constant type& name
#define MUSER_KABI_PARAM_TG(type, name) threadgroup type* name
#define MUSER_KABI_PARAM_TID(type, name) type name
#define MUSER_KABI_PARAM_TGID(type, name) type name
#define MUSER_KABI_PARAM_TPTG(type, name) type name
#define MUSER_KABI_PARAM_NTPTG(type, name) type name
#define MUSER_KABI_PARAM_NTGPG(type, name) type name
#define MUSER_KABI_PARAM_LANE(type, name) type name
#define MUSER_KABI_PARAM_SGID(type, name) type name

#if !defined(MUSER_METAL_EMULATOR)
// ---------------- Metal: the MSL signature ----------------
#define MUSER_KABI_MSL(kind, type, name, index) \
  MUSER_KABI_PARAM(kind, type, name, index) MUSER_KABI_CAT(MUSER_KABI_ATTR_, kind)(index)
#define MUSER_KABI_ATTR_BUF_IN(i) [[buffer(i)]]
#define MUSER_KABI_ATTR_BUF_OUT(i) [[buffer(i)]]
#define MUSER_KABI_ATTR_BUF_INOUT(i) [[buffer(i)]]
#define MUSER_KABI_ATTR_CONST(i) [[buffer(i)]]
#define MUSER_KABI_ATTR_TG(i) [[threadgroup(i)]]
#define MUSER_KABI_ATTR_TID(i) [[thread_position_in_grid]]
#define MUSER_KABI_ATTR_TGID(i) [[threadgroup_position_in_grid]]
#define MUSER_KABI_ATTR_TPTG(i) [[thread_position_in_threadgroup]]
#define MUSER_KABI_ATTR_NTPTG(i) [[threads_per_threadgroup]]
#define MUSER_KABI_ATTR_NTGPG(i) [[threadgroups_per_grid]]
#define MUSER_KABI_ATTR_LANE(i) [[thread_index_in_simdgroup]]
#define MUSER_KABI_ATTR_SGID(i) [[simdgroup_index_in_threadgroup]]

#define MUSER_KERNEL(name, ...) kernel void name(MUSER_KABI_MAP(MUSER_KABI_MSL, __VA_ARGS__))
#define MUSER_THREADGROUP_ARRAY(type, name, count) threadgroup type name[count]

#else
// ---------------- emulator: the function, its binding table, its registration ----------------
#include "muser_metal_emu_kernel.h"

#define MUSER_KABI_FETCH(kind, type, name, index) MUSER_KABI_CAT(MUSER_KABI_FETCH_, kind)(type, index)
#define MUSER_KABI_FETCH_BUF_IN(type, i) (device const type*)t->buffers[i]
#define MUSER_KABI_FETCH_BUF_OUT(type, i) (device type*)t->buffers[i]
#define MUSER_KABI_FETCH_BUF_INOUT(type, i) (device type*)t->buffers[i]
#define MUSER_KABI_FETCH_CONST(type, i) *(constant type*)t->buffers[i]
#define MUSER_KABI_FETCH_TG(type, i) (threadgroup type*)t->tg_memory[i]
#define MUSER_KABI_FETCH_TID(type, i) t->thread_position_in_grid
#define MUSER_KABI_FETCH_TGID(type, i) t->threadgroup_position_in_grid
#define MUSER_KABI_FETCH_TPTG(type, i) t->thread_position_in_threadgroup
#define MUSER_KABI_FETCH_NTPTG(type, i) t->threads_per_threadgroup
#define MUSER_KABI_FETCH_NTGPG(type, i) t->threadgroups_per_grid
#define MUSER_KABI_FETCH_LANE(type, i) t->thread_index_in_simdgroup
#define MUSER_KABI_FETCH_SGID(type, i) t->simdgroup_index_in_threadgroup

#define MUSER_KABI_BIND(kind, type, name, index) \
  {MUSER_KABI_CAT(MUSER_EMU_ARG_, kind), (index), MUSER_KABI_CAT(MUSER_KABI_SIZE_, kind)(type), #name}
#define MUSER_KABI_SIZE_BUF_IN(type) sizeof(type)
#define MUSER_KABI_SIZE_BUF_OUT(type) sizeof(type)
#define MUSER_KABI_SIZE_BUF_INOUT(type) sizeof(type)
#define MUSER_KABI_SIZE_CONST(type) sizeof(type)
#define MUSER_KABI_SIZE_TG(type) sizeof(type)
#define MUSER_KABI_SIZE_TID(type) 0
#define MUSER_KABI_SIZE_TGID(type) 0
#define MUSER_KABI_SIZE_TPTG(type) 0
#define MUSER_KABI_SIZE_NTPTG(type) 0
#define MUSER_KABI_SIZE_NTGPG(type) 0
#define MUSER_KABI_SIZE_LANE(type) 0
#define MUSER_KABI_SIZE_SGID(type) 0

#define MUSER_KERNEL(name, ...)                                                                              \
  static void muser_kbody_##name(MUSER_KABI_MAP(MUSER_KABI_PARAM, __VA_ARGS__));                             \
  static void muser_kinvoke_##name(const muser_emu_thread* t) {                                              \
    muser_kbody_##name(MUSER_KABI_MAP(MUSER_KABI_FETCH, __VA_ARGS__));                                       \
  }                                                                                                          \
  static const muser_emu_binding muser_kbind_##name[] = {MUSER_KABI_MAP(MUSER_KABI_BIND, __VA_ARGS__)};      \
  __attribute__((used)) static const int muser_kreg_##name = muser_emu_register_kernel(                      \
      #name, muser_kinvoke_##name, muser_kbind_##name, sizeof(muser_kbind_##name) / sizeof(muser_emu_binding)); \
  static void muser_kbody_##name(MUSER_KABI_MAP(MUSER_KABI_PARAM, __VA_ARGS__))

#define MUSER_THREADGROUP_ARRAY(type, name, count)                                                     \
  static char muser_tg_site_##name;                                                                    \
  threadgroup type* const name = (threadgroup type*)muser_emu_threadgroup_array(                       \
      &muser_tg_site_##name, sizeof(type) * (count), alignof(type), #name)
#endif
