/*
 * cudasim — the scheduler (CUDA threads as cooperative fibers) and a small
 * CUDA runtime backed by host memory. See cudasim.h for what is modelled.
 */
#include "cudasim.h"

#include <link.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_ASAN 1
#elif defined(__clang__) && defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDASIM_ASAN 1
#endif
#endif

#ifdef CUDASIM_ASAN
extern "C" void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                                size_t *size_old);
#endif

/* Context switches. swapcontext saves and restores the signal mask, a
 * system call each way, and was most of the simulator's time. On x86-64 a
 * fiber switch is a few instructions here: push the callee-saved registers
 * (and the SSE/x87 control words) on the old stack, swap stack pointers, pop
 * them from the new one. Elsewhere, or with CUDASIM_UCONTEXT=1 in the
 * environment, ucontext is used. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CUDASIM_FAST_SWITCH 1
extern "C" void cudasim_switch(void **save_sp, void *load_sp);
extern "C" void cudasim_fiber_start();
extern "C" void cudasim_fiber_main();
__asm__(".text\n"
        ".globl cudasim_switch\n"
        ".type cudasim_switch,@function\n"
        "cudasim_switch:\n"
        "    .cfi_startproc\n"
        "    endbr64\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        "    .cfi_endproc\n"
        ".size cudasim_switch, .-cudasim_switch\n"
        ".globl cudasim_fiber_start\n"
        ".type cudasim_fiber_start,@function\n"
        "cudasim_fiber_start:\n"
        "    endbr64\n"
        "    call cudasim_fiber_main\n"
        "    ud2\n"
        ".size cudasim_fiber_start, .-cudasim_fiber_start\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");
#else
#define CUDASIM_FAST_SWITCH 0
#endif

namespace cudasim {

namespace {
/* The thread-local storage of the module (executable or library) that holds
 * this file, where every __shared__ variable lives (cudasim.h): its size and,
 * for the calling thread, its address. */
thread_local char g_tls_anchor;

struct TlsBlock {
    void *data = nullptr;
    size_t size = 0;
};

int find_tls(struct dl_phdr_info *info, size_t, void *arg) {
    TlsBlock *out = static_cast<TlsBlock *>(arg);
    uintptr_t me = (uintptr_t)(void *)&find_tls;
    bool mine = false;
    size_t tls = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_LOAD && me >= info->dlpi_addr + ph.p_vaddr &&
            me < info->dlpi_addr + ph.p_vaddr + ph.p_memsz)
            mine = true;
        if (ph.p_type == PT_TLS) tls = ph.p_memsz;
    }
    if (!mine) return 0;
    out->size = tls;
    out->data = info->dlpi_tls_data;
    return 1;
}

/* This thread's block (data), and the size every thread's has. */
TlsBlock tls_block() {
    g_tls_anchor = 0; /* the block exists in this thread */
    TlsBlock b;
    dl_iterate_phdr(find_tls, &b);
    if (b.data == nullptr) b.size = 0;
    return b;
}

/* Bytes of the block no longer 0xA5, in 16-byte granules (every __shared__
 * variable is 16-byte aligned, so a granule is one variable's): what the
 * block just run wrote of its static shared memory. */
size_t touched_bytes(const TlsBlock &t) {
    static const unsigned char poison[16] = {0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5,
                                             0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5};
    uintptr_t a = (uintptr_t)t.data, start = a & ~(uintptr_t)15, end = a + t.size;
    size_t n = 0;
    for (uintptr_t g = start; g < end; g += 16) {
        uintptr_t lo = g < a ? a : g, hi = g + 16 < end ? g + 16 : end;
        if (std::memcmp((const void *)lo, poison, hi - lo) != 0) n += 16;
    }
    return n;
}

/* The calling thread's block: its address found once (a variable's offset
 * in the block is the same in every thread). */
TlsBlock this_thread_tls() {
    static const TlsBlock first = tls_block();
    static const ptrdiff_t anchor_offset =
        first.data ? (char *)&g_tls_anchor - (char *)first.data : 0;
    TlsBlock b;
    b.size = first.size;
    b.data = first.data ? (char *)&g_tls_anchor - anchor_offset : nullptr;
    return b;
}
} // namespace

uint3 cur_threadIdx;
uint3 cur_blockIdx;
dim3 cur_blockDim;
dim3 cur_gridDim;

namespace {

constexpr size_t kStackSize = 256 * 1024;

/* Fiber stacks are kept between launches: allocating (and faulting in)
 * 128 x 256 KiB per launch was most of the time of small launches. */
std::vector<char *> g_stacks;
#ifdef CUDASIM_ASAN
extern "C" void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#endif

char *take_stack() {
    char *p = nullptr;
    if (!g_stacks.empty()) {
        p = g_stacks.back();
        g_stacks.pop_back();
#ifdef CUDASIM_ASAN
        /* frames of a fiber that never returned may have left poisoned redzones */
        __asan_unpoison_memory_region(p, kStackSize);
#endif
        return p;
    }
    return static_cast<char *>(std::malloc(kStackSize));
}

void give_stack(char *p) {
    if (p != nullptr) g_stacks.push_back(p);
}

/* Free the pool at exit, so leak checkers see nothing of ours. */
struct StackPoolCleanup {
    ~StackPoolCleanup() {
        for (char *p : g_stacks) std::free(p);
        g_stacks.clear();
    }
} g_stack_pool_cleanup;

enum class State { Ready, AtBarrier, AtWarp, Done };
enum class Collective { None, Exchange, Ballot, SyncWarp };

/* One cp.async in flight: where it goes, where from, and the source bytes as
 * they were when it started (a source written before the copy lands is a race
 * the landing would otherwise hide: it reads the source only then). */
struct AsyncCopy {
    unsigned char *dst = nullptr;
    const unsigned char *src = nullptr;
    uint32_t bytes = 0;
    uint32_t group = 0; /* the issuing thread's group sequence number */
    unsigned char snapshot[16];
};

struct Fiber {
    ucontext_t ctx;
    void *sp = nullptr; /* saved stack pointer (fast switch) */
    char *stack = nullptr;
    uint3 tid{};
    unsigned warp = 0, lane = 0;
    State state = State::Ready;
    unsigned wait_gen = 0; /* warp generation this fiber waits on */
    /* cp.async: the copies not yet landed, in the order they started (so in group
     * order); groups [groups_landed, groups_committed) are committed and in
     * flight, and group number groups_committed is the open one. */
    std::vector<AsyncCopy> copies;
    uint32_t groups_committed = 0;
    uint32_t groups_landed = 0;
};

struct Warp {
    unsigned lanes = 0;     /* lanes that exist in this warp */
    unsigned done = 0;      /* lanes that have exited */
    unsigned arrived = 0;   /* lanes waiting at the current collective */
    unsigned mask = 0;      /* the current collective's mask */
    Collective kind = Collective::None;
    unsigned gen = 0;
    uint64_t slots[2][32] = {};
    unsigned participants[2] = {};
};

struct Block {
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    const std::function<void()> *body = nullptr;
    Fiber *current = nullptr;
    ucontext_t sched;
    void *sched_sp = nullptr;
    bool fast = false; /* fast switch (else ucontext) */
    std::string error; /* first divergence found */
#ifdef CUDASIM_ASAN
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
#endif
};

Block *g_block = nullptr;        /* the block being run */
unsigned char *g_dyn_smem = nullptr;
size_t g_dyn_smem_bytes = 0;     /* as the launch asked */
/* The static shared memory of the running launch: the launching thread's
 * thread-local storage (cudasim.h), where cp.async may write too. */
unsigned char *g_static_smem = nullptr;
size_t g_static_smem_bytes = 0;
std::string g_launch_error;
/* The last launch failed with this status, and no runtime call has failed
 * since: cudaGetErrorString(status) then returns g_launch_error. */
cudaError_t g_launch_status = cudaSuccess;
/* The CUDA runtime's per-thread "last error": set by every failing call,
 * returned and cleared by cudaGetLastError, returned by cudaPeekAtLastError. */
thread_local cudaError_t g_last_error = cudaSuccess;
long g_fail_malloc_at = -1;
cudaError_t g_fail_next_launch = cudaSuccess;
bool g_no_device = false;
/* cudaDevAttrMaxPitch of current GPUs */
const size_t k_hw_max_pitch = 2147483647u;
size_t g_max_pitch = k_hw_max_pitch;
int g_device = 0;
std::map<uintptr_t, size_t> g_device_allocs; /* device pointer -> size */
std::map<uintptr_t, size_t> g_host_allocs;   /* pinned host pointer -> size */

cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) {
        g_last_error = e;
        g_launch_status = cudaSuccess;
    }
    return e;
}

/* A failed launch: its description, recorded as the last error. */
cudaError_t launch_error(cudaError_t e, const std::string &what) {
    set_error(e);
    g_launch_error = "cudasim: " + what;
    g_launch_status = e;
    return e;
}

/* ---- the device: limits of an sm_90 GPU (H100 / H200) ------------------------- */
constexpr int k_sm_count = 132;
constexpr int k_max_threads_per_block = 1024;
constexpr int k_max_block_xy = 1024, k_max_block_z = 64;
constexpr unsigned k_max_grid_x = 2147483647u, k_max_grid_yz = 65535;
constexpr size_t k_smem_per_block = 48 * 1024;         /* without opt-in */
constexpr size_t k_smem_per_block_optin = 227 * 1024;  /* 232448 */
constexpr size_t k_smem_per_sm = 228 * 1024;           /* 233472 */
constexpr size_t k_smem_reserved_per_block = 1024;     /* taken by the driver */
constexpr size_t k_smem_granularity = 128;
constexpr int k_max_threads_per_sm = 2048;
constexpr int k_max_blocks_per_sm = 32;
constexpr int k_regs = 65536;

/* Per kernel: attributes set with cudaFuncSetAttribute, and the static
 * shared memory its launches have written so far. */
struct FuncAttrs {
    int max_dynamic_smem = -1; /* -1: the default, 48 KiB less the static */
    int carveout = -1;
    size_t static_seen = 0;
};
std::map<const void *, FuncAttrs> g_func_attrs;

size_t static_smem(const void *func) {
    auto it = g_func_attrs.find(func);
    return it == g_func_attrs.end() ? 0 : it->second.static_seen;
}

size_t default_max_dynamic_smem(const void *func) {
    size_t st = static_smem(func);
    return st < k_smem_per_block ? k_smem_per_block - st : 0;
}

size_t max_dynamic_smem(const void *func) {
    auto it = g_func_attrs.find(func);
    if (it == g_func_attrs.end() || it->second.max_dynamic_smem < 0) return default_max_dynamic_smem(func);
    return (size_t)it->second.max_dynamic_smem;
}

/* Does a block of `func` with `smem` bytes of dynamic shared memory (and its
 * static) fit? If not, why. */
bool smem_fits(const void *func, size_t smem, std::string *why) {
    size_t st = static_smem(func), dyn_max = max_dynamic_smem(func);
    if (smem <= dyn_max && st + smem <= k_smem_per_block_optin) return true;
    bool opted = dyn_max != default_max_dynamic_smem(func);
    char buf[360];
    snprintf(buf, sizeof buf,
             "too much shared memory: %zu bytes dynamic + %zu static per block; the kernel "
             "allows %zu dynamic (%s), the device %zu in all",
             smem, st, dyn_max,
             opted ? "its cudaFuncAttributeMaxDynamicSharedMemorySize"
                   : "48 KiB less the static, without cudaFuncSetAttribute("
                     "cudaFuncAttributeMaxDynamicSharedMemorySize)",
             k_smem_per_block_optin);
    *why = buf;
    return false;
}

/* ---- fibers -------------------------------------------------------------------- */

/* Save the running context into `from` (fiber or scheduler) and run `to`. */
inline void raw_switch(Block *b, ucontext_t *from_ctx, void **from_sp, ucontext_t *to_ctx,
                       void *to_sp) {
#if CUDASIM_FAST_SWITCH
    if (b->fast) {
        (void)from_ctx;
        (void)to_ctx;
        cudasim_switch(from_sp, to_sp);
        return;
    }
#endif
    (void)b;
    (void)from_sp;
    (void)to_sp;
    swapcontext(from_ctx, to_ctx);
}

void switch_to_scheduler(Fiber *f, bool exiting) {
    Block *b = g_block;
#ifdef CUDASIM_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, b->sched_bottom, b->sched_size);
    raw_switch(b, &f->ctx, &f->sp, &b->sched, b->sched_sp);
    __sanitizer_finish_switch_fiber(fake, &g_block->sched_bottom, &g_block->sched_size);
#else
    (void)exiting;
    raw_switch(b, &f->ctx, &f->sp, &b->sched, b->sched_sp);
#endif
}

void check_copies_at_exit(const Fiber &f);

void fiber_entry() {
    Block *b = g_block;
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &b->sched_bottom, &b->sched_size);
#endif
    Fiber *f = b->current;
    (*b->body)();
    check_copies_at_exit(*f);
    f->state = State::Done;
    b->warps[f->warp].done |= 1u << f->lane;
    switch_to_scheduler(f, true);
}

} // namespace

extern "C" void cudasim_fiber_main() { fiber_entry(); }

namespace {

void resume(Block *b, Fiber *f) {
    b->current = f;
    cur_threadIdx = f->tid;
#ifdef CUDASIM_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, kStackSize);
    raw_switch(b, &b->sched, &b->sched_sp, &f->ctx, f->sp);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    raw_switch(b, &b->sched, &b->sched_sp, &f->ctx, f->sp);
#endif
}

Fiber *self() { return g_block->current; }

void fail(const std::string &what) {
    if (g_block->error.empty()) g_block->error = what;
}

/* Block the calling fiber at a warp collective; returns the generation whose
 * slots hold the exchanged values. */
unsigned arrive_warp(Collective kind, unsigned mask, uint64_t value) {
    Fiber *f = self();
    Warp &w = g_block->warps[f->warp];
    if (!(mask & (1u << f->lane))) {
        fail("warp collective called by lane " + std::to_string(f->lane) +
             " which is not in its own mask");
    }
    if (w.arrived != 0 && (w.mask != mask || w.kind != kind)) {
        fail("warp " + std::to_string(f->warp) +
             ": lanes called different warp collectives (or different masks) at the same time");
    }
    w.mask = mask;
    w.kind = kind;
    w.arrived |= 1u << f->lane;
    w.slots[w.gen & 1][f->lane] = value;
    f->wait_gen = w.gen;
    f->state = State::AtWarp;
    switch_to_scheduler(f, false);
    return f->wait_gen;
}

/* Release warp collectives whose participants have all arrived. */
bool release_warps(Block *b) {
    bool any = false;
    for (size_t wi = 0; wi < b->warps.size(); wi++) {
        Warp &w = b->warps[wi];
        if (w.arrived == 0) continue;
        unsigned need = w.mask & w.lanes & ~w.done;
        if ((w.arrived & need) != need) continue;
        w.participants[w.gen & 1] = w.arrived;
        for (unsigned l = 0; l < 32; l++) {
            if (!(w.arrived & (1u << l))) continue;
            Fiber &f = b->fibers[wi * 32 + l];
            f.state = State::Ready;
        }
        w.arrived = 0;
        w.kind = Collective::None;
        w.gen++;
        any = true;
    }
    return any;
}

/* __syncthreads completes when every thread of the block is there. A thread
 * that has exited while others wait is a divergence: the programming guide
 * makes it undefined, and although recent GPUs often let it pass, a kernel
 * here must not depend on it. */
bool release_block_barrier(Block *b) {
    size_t waiting = 0, live = 0;
    for (const Fiber &f : b->fibers) {
        if (f.state == State::Done) continue;
        live++;
        if (f.state == State::AtBarrier) waiting++;
    }
    if (live == 0 || waiting != live) return false;
    if (live != b->fibers.size()) {
        char buf[200];
        snprintf(buf, sizeof buf,
                 "barrier divergence in block (%u,%u,%u): %zu threads wait at __syncthreads "
                 "but %zu have exited",
                 cur_blockIdx.x, cur_blockIdx.y, cur_blockIdx.z, waiting, b->fibers.size() - live);
        fail(buf);
        return false;
    }
    for (Fiber &f : b->fibers)
        if (f.state == State::AtBarrier) f.state = State::Ready;
    return true;
}

std::string describe_deadlock(const Block *b) {
    size_t at_barrier = 0, at_warp = 0, done = 0;
    for (const Fiber &f : b->fibers) {
        at_barrier += f.state == State::AtBarrier;
        at_warp += f.state == State::AtWarp;
        done += f.state == State::Done;
    }
    char buf[256];
    snprintf(buf, sizeof buf,
             "barrier divergence in block (%u,%u,%u): %zu threads at __syncthreads, %zu at a warp "
             "collective, %zu exited",
             cur_blockIdx.x, cur_blockIdx.y, cur_blockIdx.z, at_barrier, at_warp, done);
    return buf;
}

__attribute__((noinline)) void init_context(Fiber &f, bool fast) {
#if CUDASIM_FAST_SWITCH
    if (fast) {
        /* A stack that cudasim_switch "returns" into cudasim_fiber_start:
         * control words, six zeroed registers, the return address; the
         * return leaves the stack 16-byte aligned for its call. */
        uintptr_t top = ((uintptr_t)f.stack + kStackSize) & ~(uintptr_t)15;
        uint64_t *sp = (uint64_t *)(top - 64);
        uint32_t mxcsr = 0;
        uint16_t fpcw = 0;
        __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
        __asm__ volatile("fnstcw %0" : "=m"(fpcw));
        std::memset(sp, 0, 64);
        std::memcpy(sp, &mxcsr, 4);
        std::memcpy((char *)sp + 4, &fpcw, 2);
        sp[7] = (uint64_t)(uintptr_t)&cudasim_fiber_start;
        f.sp = sp;
        return;
    }
#endif
    (void)fast;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackSize;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
}

/* Give every thread of the block a fresh context at the kernel's entry.
 * Kept out of launch_blocks: getcontext returns twice, which would make the
 * caller's loop variables "clobberable". */
__attribute__((noinline)) void start_block(Block &b, dim3 block, size_t threads) {
    for (size_t i = 0; i < threads; i++) {
        Fiber &f = b.fibers[i];
        f.tid = make_uint3((unsigned)(i % block.x), (unsigned)(i / block.x % block.y),
                           (unsigned)(i / ((size_t)block.x * block.y)));
        f.warp = (unsigned)(i / 32);
        f.lane = (unsigned)(i % 32);
        f.state = State::Ready;
        /* a block that failed may have left copies in flight */
        f.copies.clear();
        f.groups_committed = 0;
        f.groups_landed = 0;
        init_context(f, b.fast);
    }
    for (size_t w = 0; w < b.warps.size(); w++) {
        Warp fresh;
        size_t n = threads - w * 32 < 32 ? threads - w * 32 : 32;
        fresh.lanes = n == 32 ? 0xffffffffu : ((1u << n) - 1u);
        b.warps[w] = fresh;
    }
}

/* Run one block to completion; returns false (with b->error) on divergence. */
bool run_block(Block *b) {
    for (;;) {
        bool ran = false;
        for (Fiber &f : b->fibers) {
            if (f.state != State::Ready) continue;
            resume(b, &f);
            ran = true;
            if (!b->error.empty()) return false;
        }
        bool all_done = true;
        for (const Fiber &f : b->fibers)
            if (f.state != State::Done) all_done = false;
        if (all_done) return true;
        bool released = release_warps(b);
        released |= release_block_barrier(b);
        if (!b->error.empty()) return false;
        if (!ran && !released) {
            b->error = describe_deadlock(b);
            return false;
        }
    }
}

} // namespace

/* ---- collectives called from kernels -------------------------------------------- */

void syncthreads() {
    Fiber *f = self();
    f->state = State::AtBarrier;
    switch_to_scheduler(f, false);
}

void syncwarp(unsigned mask) { arrive_warp(Collective::SyncWarp, mask, 0); }

uint64_t warp_exchange(unsigned mask, uint64_t mine, int src_lane) {
    unsigned gen = arrive_warp(Collective::Exchange, mask, mine);
    Fiber *f = self();
    Warp &w = g_block->warps[f->warp];
    /* Reading a lane outside the collective returns our own value (CUDA:
     * undefined); within the block's last warp, missing lanes likewise. */
    if (src_lane < 0 || src_lane > 31 || !(w.participants[gen & 1] & (1u << src_lane)))
        return mine;
    return w.slots[gen & 1][src_lane];
}

unsigned warp_ballot(unsigned mask, int pred, unsigned *participants) {
    unsigned gen = arrive_warp(Collective::Ballot, mask, pred != 0);
    Fiber *f = self();
    Warp &w = g_block->warps[f->warp];
    unsigned who = w.participants[gen & 1], ballot = 0;
    for (unsigned l = 0; l < 32; l++)
        if ((who & (1u << l)) && w.slots[gen & 1][l]) ballot |= 1u << l;
    if (participants) *participants = who;
    return ballot;
}

unsigned active_mask() {
    Fiber *f = self();
    const Warp &w = g_block->warps[f->warp];
    return w.lanes & ~w.done;
}

unsigned lane_id() { return self()->lane; }

void *dynamic_smem() { return g_dyn_smem; }

/* ---- cp.async ---------------------------------------------------------------------- */

namespace {
const unsigned char k_copy_poison[16] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                         0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};

/* "block (x,y,z), thread (x,y,z)" of the running fiber, for reports. */
std::string where(const Fiber &f) {
    char buf[96];
    snprintf(buf, sizeof buf, "block (%u,%u,%u), thread (%u,%u,%u)", cur_blockIdx.x, cur_blockIdx.y,
             cur_blockIdx.z, f.tid.x, f.tid.y, f.tid.z);
    return buf;
}

/* Where a shared-memory address is, for reports: an offset into dynamic
 * shared memory reads better than a host address. */
std::string smem_place(const void *p) {
    uintptr_t a = (uintptr_t)p, dyn = (uintptr_t)g_dyn_smem;
    char buf[96];
    if (g_dyn_smem && a >= dyn && a < dyn + g_dyn_smem_bytes)
        snprintf(buf, sizeof buf, "dynamic shared memory offset %zu", (size_t)(a - dyn));
    else
        snprintf(buf, sizeof buf, "address %p", p);
    return buf;
}

bool inside(uintptr_t a, size_t n, const void *base, size_t size) {
    uintptr_t lo = (uintptr_t)base;
    return base != nullptr && a >= lo && a <= lo + size && n <= lo + size - a;
}

/* Is [p, p+n) inside one live cudaMalloc allocation? Unlike range_ok (for
 * cudaMemcpy), host memory does not pass: cp.async reads global memory. */
bool in_device_allocation(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = g_device_allocs.upper_bound(a);
    if (it == g_device_allocs.begin()) return false;
    --it;
    return inside(a, n, (const void *)it->first, it->second);
}

/* Land one copy: the source as it is now (equal to the snapshot, or the
 * kernel raced with its own copy) into a destination nobody touched since
 * it started (else a write raced with the copy). */
void land(const Fiber &f, const AsyncCopy &c) {
    if (std::memcmp(c.dst, k_copy_poison, c.bytes) != 0) {
        fail("cp.async in " + where(f) + ": " + smem_place(c.dst) + " (" + std::to_string(c.bytes) +
             " bytes) was written while a cp.async to it was in flight (a race: a store or "
             "another cp.async must wait for the copy, and for a __syncthreads if from "
             "another thread)");
    } else if (std::memcmp(c.src, c.snapshot, c.bytes) != 0) {
        char buf[64];
        snprintf(buf, sizeof buf, "%p", (const void *)c.src);
        fail("cp.async in " + where(f) + ": the source " + buf + " (" + std::to_string(c.bytes) +
             " bytes) changed while the copy was in flight (a race)");
    }
    std::memcpy(c.dst, c.src, c.bytes);
}
} // namespace

void cp_async(void *smem_dst, const void *gmem_src, size_t bytes) {
    Fiber *f = self();
    uintptr_t d = (uintptr_t)smem_dst, s = (uintptr_t)gmem_src;
    char buf[160];
    if (bytes != 4 && bytes != 8 && bytes != 16) {
        snprintf(buf, sizeof buf, "a copy of %zu bytes: the size must be 4, 8 or 16", bytes);
        fail("cp.async in " + where(*f) + ": " + buf);
        return;
    }
    if (d % bytes != 0 || s % bytes != 0) {
        if (d % bytes != 0)
            snprintf(buf, sizeof buf, "misaligned destination (%s) for a %zu-byte copy",
                     smem_place(smem_dst).c_str(), bytes);
        else
            snprintf(buf, sizeof buf, "misaligned source %p for a %zu-byte copy", gmem_src, bytes);
        fail("cp.async in " + where(*f) + ": " + buf);
        return;
    }
    if (!inside(d, bytes, g_dyn_smem, g_dyn_smem_bytes) &&
        !inside(d, bytes, g_static_smem, g_static_smem_bytes)) {
        snprintf(buf, sizeof buf,
                 "the destination %p (%zu bytes) is not in the block's shared memory (%zu bytes "
                 "dynamic at %p)",
                 smem_dst, bytes, g_dyn_smem_bytes, (void *)g_dyn_smem);
        fail("cp.async in " + where(*f) + ": " + buf);
        return;
    }
    if (!in_device_allocation(gmem_src, bytes)) {
        snprintf(buf, sizeof buf,
                 "the source %p (%zu bytes) is not inside a live device allocation", gmem_src, bytes);
        fail("cp.async in " + where(*f) + ": " + buf);
        return;
    }
    AsyncCopy c;
    c.dst = static_cast<unsigned char *>(smem_dst);
    c.src = static_cast<const unsigned char *>(gmem_src);
    c.bytes = (uint32_t)bytes;
    c.group = f->groups_committed;
    std::memcpy(c.snapshot, gmem_src, bytes);
    f->copies.push_back(c);
    /* Until it lands the destination holds garbage: NaN in fp32 / fp16 / bf16,
     * 255 in bytes, so a read before the wait spoils the results. */
    std::memset(smem_dst, 0xFF, bytes);
}

void cp_async_commit() { self()->groups_committed++; }

void cp_async_wait(int pending) {
    Fiber *f = self();
    if (pending < 0) {
        fail("cp.async in " + where(*f) + ": cp.async.wait_group with a negative count (" +
             std::to_string(pending) + ")");
        return;
    }
    uint32_t in_flight = f->groups_committed - f->groups_landed;
    if (in_flight <= (uint32_t)pending) return;
    /* the oldest groups, all but the newest `pending` committed ones; the
     * open group's copies stay in flight (wait_group concerns committed
     * groups only) */
    uint32_t upto = f->groups_committed - (uint32_t)pending;
    size_t n = 0;
    while (n < f->copies.size() && f->copies[n].group < upto) land(*f, f->copies[n++]);
    f->copies.erase(f->copies.begin(), f->copies.begin() + (ptrdiff_t)n);
    f->groups_landed = upto;
}

namespace {
/* A thread must wait for its copies before it exits: on a GPU they land
 * after the thread is gone, maybe after another block reuses the memory. */
void check_copies_at_exit(const Fiber &f) {
    if (f.copies.empty()) return;
    size_t open = 0;
    for (const AsyncCopy &c : f.copies) open += c.group == f.groups_committed;
    char buf[192];
    snprintf(buf, sizeof buf,
             "exited with cp.async copies not waited for: %zu committed, %zu never committed; "
             "the first to %s",
             f.copies.size() - open, open, smem_place(f.copies[0].dst).c_str());
    fail("cp.async in " + where(f) + ": " + buf);
}
} // namespace

const char *last_launch_error() { return g_launch_error.c_str(); }

cudaError_t launch_blocks(const void *func, dim3 grid, dim3 block, size_t smem,
                          const std::function<void()> &body) {
    g_launch_error.clear();
    g_launch_status = cudaSuccess;
    if (g_fail_next_launch != cudaSuccess) {
        cudaError_t e = g_fail_next_launch;
        g_fail_next_launch = cudaSuccess;
        return launch_error(e, "injected launch failure");
    }
    char buf[320];
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        snprintf(buf, sizeof buf,
                 "invalid launch configuration: grid (%u,%u,%u), block (%u,%u,%u): a dimension is 0",
                 grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return launch_error(cudaErrorInvalidConfiguration, buf);
    }
    if (threads > (uint64_t)k_max_threads_per_block || block.x > (unsigned)k_max_block_xy ||
        block.y > (unsigned)k_max_block_xy || block.z > (unsigned)k_max_block_z) {
        snprintf(buf, sizeof buf,
                 "invalid launch configuration: block (%u,%u,%u) = %llu threads; the device allows "
                 "%d threads per block, at most (%d,%d,%d)",
                 block.x, block.y, block.z, (unsigned long long)threads, k_max_threads_per_block,
                 k_max_block_xy, k_max_block_xy, k_max_block_z);
        return launch_error(cudaErrorInvalidConfiguration, buf);
    }
    if (grid.x > k_max_grid_x || grid.y > k_max_grid_yz || grid.z > k_max_grid_yz) {
        snprintf(buf, sizeof buf,
                 "invalid launch configuration: grid (%u,%u,%u); the device allows at most "
                 "(%u,%u,%u)",
                 grid.x, grid.y, grid.z, k_max_grid_x, k_max_grid_yz, k_max_grid_yz);
        return launch_error(cudaErrorInvalidConfiguration, buf);
    }
    std::string why;
    if (!smem_fits(func, smem, &why)) return launch_error(cudaErrorInvalidValue, why);
    std::vector<unsigned char> dyn(smem + 16);
    unsigned char *saved_dyn = g_dyn_smem, *saved_static = g_static_smem;
    size_t saved_dyn_bytes = g_dyn_smem_bytes, saved_static_bytes = g_static_smem_bytes;
    g_dyn_smem = dyn.data();
    g_dyn_smem_bytes = smem;

    Block b;
    b.body = &body;
    static const bool use_ucontext = [] {
        const char *e = std::getenv("CUDASIM_UCONTEXT");
        return e != nullptr && e[0] == '1';
    }();
    b.fast = CUDASIM_FAST_SWITCH && !use_ucontext;
    b.fibers.resize(threads);
    b.warps.resize((threads + 31) / 32);
    for (size_t i = 0; i < threads; i++) {
        b.fibers[i].stack = take_stack();
        if (!b.fibers[i].stack) {
            for (size_t j = 0; j < i; j++) give_stack(b.fibers[j].stack);
            g_dyn_smem = saved_dyn;
            g_dyn_smem_bytes = saved_dyn_bytes;
            return launch_error(cudaErrorMemoryAllocation, "out of host memory for thread stacks");
        }
    }
    cur_blockDim = block;
    cur_gridDim = grid;
    Block *saved = g_block;
    g_block = &b;
    bool ok = true;
    /* The static shared memory is this thread's thread-local storage
     * (__shared__ is thread_local): saved, poisoned before each block, and
     * restored for the host code's own thread-locals (the last error, ...). */
    TlsBlock tls = this_thread_tls();
    /* Not on the heap while it fits: a heap block here changed glibc's
     * heuristics for the 4 MiB device allocations of the tests (served from
     * a trimmed and regrown heap instead of mmap), and every one of them
     * faulted its pages in again: twice the run time. */
    static unsigned char host_tls_static[64 * 1024];
    std::vector<unsigned char> host_tls_heap;
    unsigned char *host_tls = host_tls_static;
    if (tls.size > sizeof host_tls_static) {
        host_tls_heap.resize(tls.size);
        host_tls = host_tls_heap.data();
    }
    if (tls.size != 0) std::memcpy(host_tls, tls.data, tls.size);
    g_static_smem = static_cast<unsigned char *>(tls.data);
    g_static_smem_bytes = tls.size;
    size_t static_seen = 0;
    for (unsigned bz = 0; bz < grid.z && ok; bz++)
        for (unsigned by = 0; by < grid.y && ok; by++)
            for (unsigned bx = 0; bx < grid.x && ok; bx++) {
                cur_blockIdx = make_uint3(bx, by, bz);
                /* Shared memory starts undefined on a GPU: poison it so a kernel
                 * that reads before writing is caught by the comparisons, and
                 * never sees the previous block's values. */
                std::memset(dyn.data(), 0xA5, dyn.size());
                if (tls.size != 0) std::memset(tls.data, 0xA5, tls.size);
                start_block(b, block, threads);
                ok = run_block(&b);
                if (tls.size != 0) {
                    size_t t = touched_bytes(tls);
                    if (t > static_seen) static_seen = t;
                }
            }
    if (tls.size != 0) std::memcpy(tls.data, host_tls, tls.size);
    g_block = saved;
    g_dyn_smem = saved_dyn;
    g_dyn_smem_bytes = saved_dyn_bytes;
    g_static_smem = saved_static;
    g_static_smem_bytes = saved_static_bytes;
    for (Fiber &f : b.fibers) give_stack(f.stack);
    if (!ok) return launch_error(cudaErrorLaunchFailure, b.error);
    /* A kernel's static shared memory is known once it has run: a launch that
     * did not fit is reported now (on a GPU it would not have run). */
    if (static_seen > static_smem(func)) {
        g_func_attrs[func].static_seen = static_seen;
        if (!smem_fits(func, smem, &why))
            return launch_error(cudaErrorInvalidValue, why + " (found once its blocks had run)");
    }
    return cudaSuccess;
}

void fail_malloc_at(long n) { g_fail_malloc_at = n; }
void fail_next_launch(cudaError_t e) { g_fail_next_launch = e; }
long live_allocations() { return (long)g_device_allocs.size(); }
void set_no_device(bool none) { g_no_device = none; }
void set_max_pitch(size_t bytes) { g_max_pitch = bytes ? bytes : k_hw_max_pitch; }

namespace {
bool injected_malloc_failure() {
    if (g_fail_malloc_at < 0) return false;
    if (g_fail_malloc_at == 0) {
        g_fail_malloc_at = -1;
        return true;
    }
    g_fail_malloc_at--;
    return false;
}

/* Is [p, p+n) inside one live allocation (device or pinned host)? Plain host
 * memory is accepted as is: the simulator cannot tell it from pageable memory. */
bool range_ok(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    for (const auto *m : {&g_device_allocs, &g_host_allocs}) {
        auto it = m->upper_bound(a);
        if (it == m->begin()) continue;
        --it;
        if (a >= it->first && a < it->first + it->second) return a + n <= it->first + it->second;
    }
    return true;
}
} // namespace

} // namespace cudasim

using namespace cudasim;

/* ---- the runtime API ------------------------------------------------------------------ */

extern "C" {

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    /* the last launch's own description, while it is the latest failure */
    if (e != cudaSuccess && e == g_launch_status && !g_launch_error.empty())
        return g_launch_error.c_str();
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure:
        return g_launch_error.empty() ? "unspecified launch failure" : g_launch_error.c_str();
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error";
    }
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return set_error(cudaErrorInvalidValue);
    if (g_no_device) {
        *count = 0;
        return set_error(cudaErrorNoDevice);
    }
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return set_error(cudaErrorInvalidValue);
    *device = g_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (g_no_device) return set_error(cudaErrorNoDevice);
    if (device != 0) return set_error(cudaErrorInvalidDevice);
    g_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (!prop) return set_error(cudaErrorInvalidValue);
    if (g_no_device) return set_error(cudaErrorNoDevice);
    if (device != 0) return set_error(cudaErrorInvalidDevice);
    std::memset(prop, 0, sizeof *prop);
    std::snprintf(prop->name, sizeof prop->name, "cudasim (CPU simulator)");
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = k_sm_count;
    prop->totalGlobalMem = (size_t)80 << 30;
    prop->sharedMemPerBlock = k_smem_per_block;
    prop->sharedMemPerBlockOptin = k_smem_per_block_optin;
    prop->sharedMemPerMultiprocessor = k_smem_per_sm;
    prop->reservedSharedMemPerBlock = k_smem_reserved_per_block;
    prop->regsPerBlock = k_regs;
    prop->regsPerMultiprocessor = k_regs;
    prop->warpSize = 32;
    prop->memPitch = g_max_pitch;
    prop->maxThreadsPerBlock = k_max_threads_per_block;
    prop->maxThreadsDim[0] = k_max_block_xy;
    prop->maxThreadsDim[1] = k_max_block_xy;
    prop->maxThreadsDim[2] = k_max_block_z;
    prop->maxGridSize[0] = (int)k_max_grid_x;
    prop->maxGridSize[1] = (int)k_max_grid_yz;
    prop->maxGridSize[2] = (int)k_max_grid_yz;
    prop->maxThreadsPerMultiProcessor = k_max_threads_per_sm;
    prop->maxBlocksPerMultiProcessor = k_max_blocks_per_sm;
    prop->totalConstMem = 64 * 1024;
    prop->l2CacheSize = 50 * 1024 * 1024;
    prop->concurrentKernels = 1;
    prop->asyncEngineCount = 2;
    prop->unifiedAddressing = 1;
    prop->canMapHostMemory = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (!value) return set_error(cudaErrorInvalidValue);
    if (g_no_device) return set_error(cudaErrorNoDevice);
    if (device != 0) return set_error(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = k_sm_count; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)k_smem_per_block; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)k_smem_per_block_optin; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)k_smem_per_sm; break;
    case cudaDevAttrReservedSharedMemoryPerBlock: *value = (int)k_smem_reserved_per_block; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = k_max_threads_per_block; break;
    case cudaDevAttrMaxBlockDimX: *value = k_max_block_xy; break;
    case cudaDevAttrMaxBlockDimY: *value = k_max_block_xy; break;
    case cudaDevAttrMaxBlockDimZ: *value = k_max_block_z; break;
    case cudaDevAttrMaxGridDimX: *value = (int)k_max_grid_x; break;
    case cudaDevAttrMaxGridDimY: *value = (int)k_max_grid_yz; break;
    case cudaDevAttrMaxGridDimZ: *value = (int)k_max_grid_yz; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = k_max_threads_per_sm; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = k_max_blocks_per_sm; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = k_regs; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = k_regs; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrTotalConstantMemory: *value = 64 * 1024; break;
    case cudaDevAttrL2CacheSize: *value = 50 * 1024 * 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxPitch: *value = (int)g_max_pitch; break;
    default: *value = 0; break;
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    if (!free_b || !total) return set_error(cudaErrorInvalidValue);
    size_t used = 0;
    for (const auto &a : g_device_allocs) used += a.second;
    *total = (size_t)80 << 30;
    *free_b = *total > used ? *total - used : 0;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t size) {
    if (!p) return set_error(cudaErrorInvalidValue);
    if (injected_malloc_failure()) return set_error(cudaErrorMemoryAllocation);
    if (size == 0) {
        *p = nullptr;
        return cudaSuccess;
    }
    void *m = nullptr;
    if (posix_memalign(&m, 256, size) != 0) return set_error(cudaErrorMemoryAllocation);
    std::memset(m, 0xCD, size); /* device memory starts undefined */
    g_device_allocs[(uintptr_t)m] = size;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    auto it = g_device_allocs.find((uintptr_t)p);
    if (it == g_device_allocs.end()) return set_error(cudaErrorInvalidDevicePointer);
    g_device_allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t size) {
    if (!p) return set_error(cudaErrorInvalidValue);
    if (injected_malloc_failure()) return set_error(cudaErrorMemoryAllocation);
    void *m = nullptr;
    if (posix_memalign(&m, 4096, size ? size : 1) != 0) return set_error(cudaErrorMemoryAllocation);
    g_host_allocs[(uintptr_t)m] = size;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
    (void)flags;
    return cudaMallocHost(p, size);
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    auto it = g_host_allocs.find((uintptr_t)p);
    if (it == g_host_allocs.end()) return set_error(cudaErrorInvalidValue);
    g_host_allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    (void)kind;
    if (n == 0) return cudaSuccess;
    if (!dst || !src || !range_ok(dst, n) || !range_ok(src, n)) return set_error(cudaErrorInvalidValue);
    std::memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    (void)stream;
    return cudaMemcpy(dst, src, n, kind);
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind) {
    (void)kind;
    if (width == 0 || height == 0) return cudaSuccess;
    if (!dst || !src || width > dpitch || width > spitch) return set_error(cudaErrorInvalidValue);
    if ((height > 1 && dpitch > g_max_pitch) || (height > 1 && spitch > g_max_pitch))
        return set_error(cudaErrorInvalidPitchValue);
    for (size_t r = 0; r < height; r++) {
        uint8_t *d = static_cast<uint8_t *>(dst) + r * dpitch;
        const uint8_t *s = static_cast<const uint8_t *>(src) + r * spitch;
        if (!range_ok(d, width) || !range_ok(s, width)) return set_error(cudaErrorInvalidValue);
        std::memmove(d, s, width);
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream) {
    (void)stream;
    return cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind);
}

cudaError_t cudaMemset(void *p, int value, size_t n) {
    if (n == 0) return cudaSuccess;
    if (!p || !range_ok(p, n)) return set_error(cudaErrorInvalidValue);
    std::memset(p, value, n);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t stream) {
    (void)stream;
    return cudaMemset(p, value, n);
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    if (!s) return set_error(cudaErrorInvalidValue);
    *s = reinterpret_cast<cudaStream_t>(new char);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    (void)flags;
    return cudaStreamCreate(s);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete reinterpret_cast<char *>(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
    if (!e) return set_error(cudaErrorInvalidValue);
    *e = reinterpret_cast<cudaEvent_t>(new char);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    (void)flags;
    return cudaEventCreate(e);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete reinterpret_cast<char *>(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)e;
    (void)s;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    (void)e;
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    (void)a;
    (void)b;
    if (!ms) return set_error(cudaErrorInvalidValue);
    *ms = 0.0f; /* the simulator does not model time */
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)s;
    (void)e;
    (void)flags;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (!func) return set_error(cudaErrorInvalidDeviceFunction);
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize: {
        /* the device's opt-in limit, less the kernel's static shared memory */
        size_t st = static_smem(func);
        if (value < 0 || (size_t)value + st > k_smem_per_block_optin) return set_error(cudaErrorInvalidValue);
        g_func_attrs[func].max_dynamic_smem = value;
        return cudaSuccess;
    }
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        if (value < -1 || value > 100) return set_error(cudaErrorInvalidValue);
        g_func_attrs[func].carveout = value;
        return cudaSuccess;
    default:
        return cudaSuccess; /* cluster attributes etc.: accepted, not modelled */
    }
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
    if (!attr) return set_error(cudaErrorInvalidValue);
    if (!func) return set_error(cudaErrorInvalidDeviceFunction);
    std::memset(attr, 0, sizeof *attr);
    attr->sharedSizeBytes = static_smem(func); /* as its launches so far have written it */
    attr->maxThreadsPerBlock = k_max_threads_per_block;
    attr->numRegs = 0; /* unknown: the simulator has no register allocation */
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    attr->maxDynamicSharedSizeBytes = (int)max_dynamic_smem(func);
    auto it = g_func_attrs.find(func);
    attr->preferredShmemCarveout = it == g_func_attrs.end() ? -1 : it->second.carveout;
    return cudaSuccess;
}

/* Blocks of `func` resident on one SM: limited by threads (2048 per SM, whole
 * warps), blocks (32) and shared memory (228 KiB per SM, each block's static
 * + dynamic rounded up to 128 bytes plus 1 KiB the driver reserves).
 * Registers are not modelled (the simulator does not know a kernel's count):
 * on a GPU the result can be lower. */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, const void *func,
                                                                   int blockSize,
                                                                   size_t dynamicSMemSize,
                                                                   unsigned int flags) {
    (void)flags;
    if (!numBlocks || blockSize <= 0) return set_error(cudaErrorInvalidValue);
    if (!func) return set_error(cudaErrorInvalidDeviceFunction);
    *numBlocks = 0;
    if (blockSize > k_max_threads_per_block || dynamicSMemSize > max_dynamic_smem(func))
        return cudaSuccess;
    int warps = (blockSize + 31) / 32;
    int by_threads = k_max_threads_per_sm / 32 / warps;
    size_t smem = static_smem(func) + dynamicSMemSize;
    smem = (smem + k_smem_granularity - 1) / k_smem_granularity * k_smem_granularity;
    int by_smem = (int)(k_smem_per_sm / (smem + k_smem_reserved_per_block));
    int n = by_threads < k_max_blocks_per_sm ? by_threads : k_max_blocks_per_sm;
    *numBlocks = by_smem < n ? by_smem : n;
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func,
                                                          int blockSize, size_t dynamicSMemSize) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize,
                                                                  dynamicSMemSize,
                                                                  cudaOccupancyDefault);
}

} /* extern "C" */
