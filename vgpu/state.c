/* Mapping the state file, and reading consistent copies out of it (see state.h). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* syscall(2), for futex(2) */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* A writer is inside a write for microseconds; one stuck far longer has died mid-write, and
 * the caller gets NVML_ERROR_UNKNOWN rather than a value nobody finished writing. */
#define READ_DEADLINE_NS (500ull * 1000 * 1000)

static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;
static const unsigned char *_Atomic g_base;
static dev_t g_dev;
static ino_t g_ino;
static struct vgpu_image g_default;

static const unsigned char *default_base(void)
{
    return (const unsigned char *)&g_default;
}

/* Slicing-by-8: eight tables, eight bytes a step. Every call copies and checks a GPU's whole record
 * (about 21 KiB), so a byte-at-a-time CRC would be most of what a call costs the caller, and most of
 * what the virtual GPU adds to any exporter measured on it; a real driver pays nothing like it. */
static uint32_t g_crc_table[8][256];
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        g_crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            g_crc_table[t][i] = g_crc_table[0][g_crc_table[t - 1][i] & 0xFF] ^ (g_crc_table[t - 1][i] >> 8);
}

/* The CRC-32 of zlib.crc32, which the Python writer uses. */
uint32_t vgpu_crc32(const void *data, size_t len)
{
    pthread_once(&g_crc_once, crc_table_init);
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (; len >= 8; len -= 8, p += 8) {
        /* Byte by byte into the word, so the result does not depend on the host's byte order. */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = g_crc_table[7][lo & 0xFF] ^ g_crc_table[6][(lo >> 8) & 0xFF] ^ g_crc_table[5][(lo >> 16) & 0xFF] ^
            g_crc_table[4][lo >> 24] ^ g_crc_table[3][p[4]] ^ g_crc_table[2][p[5]] ^ g_crc_table[1][p[6]] ^
            g_crc_table[0][p[7]];
    }
    for (; len > 0; len--, p++)
        c = g_crc_table[0][(c ^ *p) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint64_t vgpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void vgpu_sleep_us(unsigned int us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

/* How long one sleep lasts at most. Asleep on the futex, a waiter is woken by every write, so it wakes on
 * its own only in case a writer does not (one on a machine whose futex(2) it cannot call): once a second,
 * which is all a quiet node costs. Without a futex it looks every 100 ms. */
#define WOKEN_WAIT_MAX_US 1000000u
#define SLEEP_WAIT_MAX_US 100000u

/* Sleeps until the state file's seq no longer reads `seen`, or `us` microseconds have passed (or the bound
 * above: the caller looks again and sleeps on). On Linux the writer wakes the waiters on seq's (little-endian)
 * low word after every write (exporter/vgpu/state.py), as the kernel wakes a real driver's waiter. */
void vgpu_wait_change_us(uint64_t seen, unsigned int us)
{
#ifdef __linux__
    const unsigned char *base = atomic_load(&g_base);
    if (base != NULL && base != default_base()) {
        if (us > WOKEN_WAIT_MAX_US)
            us = WOKEN_WAIT_MAX_US;
        struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
        const uint32_t *word = (const uint32_t *)(uintptr_t)(base + offsetof(struct vgpu_header, seq));
        /* Not FUTEX_PRIVATE: the writer is another process, sharing the file's pages. */
        syscall(SYS_futex, word, FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
        return; /* woken, timed out, interrupted, or seq had moved already: the caller looks again */
    }
#endif
    (void)seen;
    vgpu_sleep_us(us < SLEEP_WAIT_MAX_US ? us : SLEEP_WAIT_MAX_US);
}

static int layout_matches(const struct vgpu_header *h)
{
    return memcmp(h->magic, VGPU_MAGIC, sizeof h->magic) == 0 && h->layout_version == VGPU_LAYOUT_VERSION &&
           h->header_size == sizeof(struct vgpu_header) && h->gpu_size == sizeof(struct vgpu_gpu) &&
           h->max_gpus == VGPU_MAX_GPUS && h->event_capacity == VGPU_EVENT_CAPACITY && h->file_size == VGPU_FILE_SIZE;
}

static nvmlReturn_t refuse(const char *path, const char *why, nvmlReturn_t ret)
{
    /* The caller sees only a return code; the developer who pointed the library at a bad file
     * needs the reason. */
    fprintf(stderr, "vgpu: GPU_TRIAGE_VGPU_STATE=%s: %s\n", path, why);
    return ret;
}

static nvmlReturn_t map_file(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return refuse(path, strerror(errno), NVML_ERROR_DRIVER_NOT_LOADED);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return refuse(path, strerror(errno), NVML_ERROR_DRIVER_NOT_LOADED);
    }
    const unsigned char *current = atomic_load(&g_base);
    if (current != NULL && current != default_base() && st.st_dev == g_dev && st.st_ino == g_ino) {
        close(fd);
        return NVML_SUCCESS; /* still the file we mapped: re-initialising must not map it again */
    }
    if ((size_t)st.st_size < VGPU_FILE_SIZE) {
        close(fd);
        return refuse(path, "shorter than the state layout this library reads", NVML_ERROR_LIB_RM_VERSION_MISMATCH);
    }
    void *map = mmap(NULL, VGPU_FILE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return refuse(path, strerror(errno), NVML_ERROR_DRIVER_NOT_LOADED);
    if (!layout_matches(map)) {
        munmap(map, VGPU_FILE_SIZE);
        return refuse(path, "not a state file of layout version 1", NVML_ERROR_LIB_RM_VERSION_MISMATCH);
    }
    g_dev = st.st_dev;
    g_ino = st.st_ino;
    /* A previous mapping (the file was replaced between a shutdown and this init) is left
     * mapped: a call that began before the shutdown may still be reading it. */
    atomic_store(&g_base, (const unsigned char *)map);
    return NVML_SUCCESS;
}

nvmlReturn_t vgpu_state_open(void)
{
    const char *path = getenv("GPU_TRIAGE_VGPU_STATE");
    pthread_mutex_lock(&g_open_lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (path != NULL && path[0] != '\0') {
        ret = map_file(path);
    } else if (atomic_load(&g_base) != default_base()) {
        vgpu_default_image(&g_default);
        atomic_store(&g_base, default_base());
    }
    pthread_mutex_unlock(&g_open_lock);
    return ret;
}

struct region {
    size_t offset;
    void *dst;
    size_t len;
    int (*valid)(const void *copy);
};

uint64_t vgpu_state_seq(void)
{
    const unsigned char *base = atomic_load(&g_base);
    if (base == NULL)
        return 1; /* odd: nothing to rely on */
    return atomic_load_explicit((_Atomic uint64_t *)(uintptr_t)(base + offsetof(struct vgpu_header, seq)),
                                memory_order_acquire);
}

/* The seq a copy was taken under, for a validator to see (this thread's last seq_read). */
static _Thread_local uint64_t t_copy_seq;

static nvmlReturn_t seq_read(const struct region *regions, size_t count)
{
    const unsigned char *base = atomic_load(&g_base);
    if (base == NULL)
        return NVML_ERROR_UNINITIALIZED;
    _Atomic uint64_t *seq = (_Atomic uint64_t *)(uintptr_t)(base + offsetof(struct vgpu_header, seq));
    uint64_t start = 0;
    for (unsigned int attempt = 0;; attempt++) {
        uint64_t s1 = atomic_load_explicit(seq, memory_order_acquire);
        if ((s1 & 1) == 0) {
            for (size_t i = 0; i < count; i++)
                memcpy(regions[i].dst, base + regions[i].offset, regions[i].len);
            atomic_thread_fence(memory_order_acquire);
            uint64_t s2 = atomic_load_explicit(seq, memory_order_relaxed);
            int ok = s1 == s2;
            t_copy_seq = s1;
            for (size_t i = 0; ok && i < count; i++)
                ok = regions[i].valid(regions[i].dst);
            if (ok)
                return NVML_SUCCESS;
        }
        if (attempt == 0)
            start = vgpu_now_ns();
        else if (vgpu_now_ns() - start > READ_DEADLINE_NS)
            return NVML_ERROR_UNKNOWN;
        if (attempt > 16)
            vgpu_sleep_us(50);
    }
}

static int header_valid(const void *copy)
{
    const struct vgpu_header *h = copy;
    const size_t from = offsetof(struct vgpu_header, event_total);
    return h->crc == vgpu_crc32((const unsigned char *)h + from, sizeof *h - from) && h->gpu_count <= VGPU_MAX_GPUS;
}

/* Per thread, per GPU: the seq (plus one; 0: none yet) under which a copy of the record last passed its CRC,
 * and that CRC. A copy taken under the same seq, with the same CRC, is the same record: the writer moves seq on
 * every write. So a call checks a record's 21 KiB once per write, not once per call; a real driver does
 * nothing of the kind, and the check would otherwise be most of what a call costs its caller. */
static _Thread_local struct {
    uint64_t seq_plus_one;
    uint32_t crc;
} t_verified[VGPU_MAX_GPUS];
static _Thread_local unsigned int t_index;

static int gpu_valid(const void *copy)
{
    const struct vgpu_gpu *g = copy;
    int same = t_verified[t_index].seq_plus_one == t_copy_seq + 1 && t_verified[t_index].crc == g->crc;
    if (!same) {
        if (g->crc != vgpu_crc32((const unsigned char *)g + sizeof g->crc, sizeof *g - sizeof g->crc))
            return 0;
        t_verified[t_index].seq_plus_one = t_copy_seq + 1;
        t_verified[t_index].crc = g->crc;
    }
    return g->nvlink_count <= VGPU_MAX_LINKS && g->mig_count <= VGPU_MAX_MIG && g->mig_max <= VGPU_MAX_MIG &&
           g->proc_count <= VGPU_MAX_PROCS && g->override_count <= VGPU_MAX_OVERRIDES &&
           g->retired_count[0] <= VGPU_MAX_RETIRED && g->retired_count[1] <= VGPU_MAX_RETIRED;
}

static int event_valid(const void *copy)
{
    const struct vgpu_event *e = copy;
    if (e->seq == 0 && e->crc == 0)
        return 1; /* a slot no event has reached yet */
    return e->crc == vgpu_crc32(e, offsetof(struct vgpu_event, crc));
}

nvmlReturn_t vgpu_read_header(struct vgpu_header *out)
{
    struct region r = {0, out, sizeof *out, header_valid};
    return seq_read(&r, 1);
}

nvmlReturn_t vgpu_read_gpu(unsigned int index, struct vgpu_gpu *out)
{
    if (index >= VGPU_MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    t_index = index;
    struct region r = {offsetof(struct vgpu_image, gpus) + index * sizeof(struct vgpu_gpu), out, sizeof *out, gpu_valid};
    return seq_read(&r, 1);
}

nvmlReturn_t vgpu_read_event(uint64_t n, struct vgpu_event *out, uint64_t *total)
{
    struct vgpu_header h;
    size_t slot = (size_t)((n - 1) % VGPU_EVENT_CAPACITY);
    struct region r[2] = {
        {0, &h, sizeof h, header_valid},
        {offsetof(struct vgpu_image, events) + slot * sizeof(struct vgpu_event), out,
         sizeof *out, event_valid},
    };
    uint64_t start = vgpu_now_ns();
    for (;;) {
        nvmlReturn_t ret = seq_read(r, 2);
        if (ret != NVML_SUCCESS)
            return ret;
        *total = h.event_total;
        if (n == 0 || n > h.event_total || out->seq > n)
            return NVML_ERROR_NOT_FOUND; /* not published yet, or overwritten by a later event */
        if (out->seq == n)
            return NVML_SUCCESS;
        /* The count already says n but the slot still shows an older event: only a weakly
         * ordered CPU shows that, for as long as the writer's stores take to arrive. */
        if (vgpu_now_ns() - start > READ_DEADLINE_NS)
            return NVML_ERROR_UNKNOWN;
        vgpu_sleep_us(50);
    }
}
