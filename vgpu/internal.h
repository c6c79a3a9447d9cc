/* What the vgpu source files share; nothing here is exported. */
#ifndef VGPU_INTERNAL_H
#define VGPU_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nvml_types.h"
#include "state.h"

/* state.c: the mapping and consistent reads from it. */
nvmlReturn_t vgpu_state_open(void);
nvmlReturn_t vgpu_read_header(struct vgpu_header *out);
nvmlReturn_t vgpu_read_gpu(unsigned int index, struct vgpu_gpu *out);
/* Event n (1-based) with the event_total of the same snapshot; NOT_FOUND once overwritten. */
nvmlReturn_t vgpu_read_event(uint64_t n, struct vgpu_event *out, uint64_t *total);
/* The header's seq now: equal and even twice, and nothing in the file changed in between. */
uint64_t vgpu_state_seq(void);
uint32_t vgpu_crc32(const void *data, size_t len);
uint64_t vgpu_now_ns(void);
void vgpu_sleep_us(unsigned int us);
/* Sleeps until seq no longer reads `seen` (the writer wakes the waiters), or `us` microseconds have passed
 * (at most 1 s on the futex, 100 ms without it: the caller looks again). */
void vgpu_wait_change_us(uint64_t seen, unsigned int us);

/* defaults.c: the node presented when GPU_TRIAGE_VGPU_STATE is unset. */
void vgpu_default_image(struct vgpu_image *image);

/* library.c: init state, handles and the gate every device call goes through. */
int vgpu_initialized(void);

struct nvmlDevice_st {
    unsigned int gpu;
    int mig;                          /* slot in vgpu_gpu.mig, or -1 for the whole GPU */
    _Atomic unsigned int generation; /* a MIG handle: the GPU's reset_generation when it was handed out */
};

nvmlDevice_t vgpu_gpu_handle(unsigned int gpu);
/* A MIG device's handle, valid until the GPU's next reset (`rec` is the GPU's snapshot now). */
nvmlDevice_t vgpu_mig_handle(unsigned int gpu, unsigned int slot, const struct vgpu_gpu *rec);
/* Whether the caller acts with root's privileges: not when GPU_TRIAGE_VGPU_UNPRIVILEGED=1 was set at
 * nvmlInit. The header makes some MIG-mode aggregates need them. */
int vgpu_privileged(void);

struct vgpu_call {
    unsigned int gpu;
    int mig;
    struct vgpu_gpu rec; /* one consistent snapshot of the GPU, taken after the gate */
};

/* The header: "In MIG mode, if device handle is provided, the API returns aggregate information, only
 * if the caller has appropriate privileges." NO_PERMISSION, then, or SUCCESS. */
nvmlReturn_t vgpu_aggregate_allowed(const struct vgpu_call *c);

#define VGPU_NO_QUERY (-1)
#define VGPU_ACCEPT_MIG 1u /* the call is meaningful on a MIG device handle */

/*
 * Every device call starts here, in NVML's order of checks: initialised, then arguments
 * (args_ok is the caller's verdict on its pointers and enums), then the handle, then the
 * GPU's fault flags (lost, reset in flight, hung: wait), then whether `query` is supported.
 */
nvmlReturn_t vgpu_begin(nvmlDevice_t device, int args_ok, int query, unsigned int flags, struct vgpu_call *call);
int vgpu_query_unsupported(const struct vgpu_gpu *gpu, int query);
nvmlReturn_t vgpu_copy_string(char *dst, unsigned int length, const char *src, size_t src_size);

/* Most queries are one value out of the GPU's snapshot: the gate, a NULL check, a copy. */
#define GETTER(fn, type, query, expr)                                                                                 \
    NVML_EXPORT nvmlReturn_t fn(nvmlDevice_t device, type *out)                                                       \
    {                                                                                                                 \
        struct vgpu_call c;                                                                                           \
        nvmlReturn_t ret = vgpu_begin(device, out != NULL, query, 0, &c);                                             \
        if (ret == NVML_SUCCESS)                                                                                      \
            *out = (type)(expr);                                                                                      \
        return ret;                                                                                                   \
    }


/* health.c: shared with the field table, which answers the same questions by field id. */
uint64_t vgpu_ecc_total(const struct vgpu_gpu *g, unsigned int error_type, unsigned int counter_type);
int vgpu_remap_blocked(const struct vgpu_gpu *g);
uint64_t vgpu_link_error(const struct vgpu_link *l, unsigned int counter);

#endif
