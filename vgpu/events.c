/*
 * Event sets. The writer appends events (XIDs above all) to the state file's ring; a set
 * remembers how far it has read and, per GPU, which types were registered and from which
 * event on, so that what happened before registration is not delivered (as the header says).
 * nvmlEventSetWait_v2 sleeps until the state file changes (the writer wakes it, as the kernel wakes
 * a real driver's waiter) or its timeout passes; where no wake comes, it looks again now and then
 * (vgpu_wait_change_us says how often).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

struct nvmlEventSet_st {
    pthread_mutex_t lock;
    uint64_t cursor;                /* events up to this number have been looked at */
    uint64_t mask[VGPU_MAX_GPUS];   /* registered event types */
    uint64_t since[VGPU_MAX_GPUS];  /* the event count when the GPU was registered */
    uint64_t lost_seq;              /* the state's seq when `lost` was worked out; odd: never */
    int lost;                       /* a registered GPU was lost then */
    struct nvmlEventSet_st *next;
};

/* Sets are found through this list before use, so a stranger's pointer, or a freed set, is an
 * invalid argument rather than a crash. Freeing a set while another thread waits on it is the
 * caller's bug, as with NVML. */
static pthread_mutex_t g_sets_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nvmlEventSet_st *g_sets;

static struct nvmlEventSet_st *find_set(nvmlEventSet_t set, int unlink)
{
    pthread_mutex_lock(&g_sets_lock);
    struct nvmlEventSet_st **p = &g_sets;
    while (*p != NULL && *p != set.handle)
        p = &(*p)->next;
    struct nvmlEventSet_st *found = *p;
    if (found != NULL && unlink)
        *p = found->next;
    pthread_mutex_unlock(&g_sets_lock);
    return found;
}

static nvmlReturn_t event_total(uint64_t *total)
{
    struct vgpu_header h;
    nvmlReturn_t ret = vgpu_read_header(&h);
    if (ret == NVML_SUCCESS)
        *total = h.event_total;
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!vgpu_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NVML_ERROR_MEMORY;
    s->lost_seq = 1;
    nvmlReturn_t ret = event_total(&s->cursor);
    if (ret != NVML_SUCCESS) {
        free(s);
        return ret;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_lock(&g_sets_lock);
    s->next = g_sets;
    g_sets = s;
    pthread_mutex_unlock(&g_sets_lock);
    set->handle = s;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!vgpu_initialized())
        return NVML_ERROR_UNINITIALIZED;
    struct nvmlEventSet_st *s = find_set(set, 1);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_destroy(&s->lock);
    free(s);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    struct vgpu_call c;
    nvmlReturn_t ret = vgpu_begin(device, eventTypes != NULL, VGPU_NO_QUERY, 0, &c);
    if (ret == NVML_SUCCESS)
        *eventTypes = vgpu_query_unsupported(&c.rec, VGPU_Q_EVENTS) ? 0 : c.rec.supported_events;
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                  nvmlEventSet_t set)
{
    struct vgpu_call c;
    struct nvmlEventSet_st *s = vgpu_initialized() ? find_set(set, 0) : NULL;
    int args_ok = s != NULL && (eventTypes & ~(unsigned long long)nvmlEventTypeAll) == 0;
    nvmlReturn_t ret = vgpu_begin(device, args_ok, VGPU_Q_EVENTS, 0, &c);
    if (ret != NVML_SUCCESS)
        return ret;
    if (eventTypes & ~c.rec.supported_events)
        return NVML_ERROR_NOT_SUPPORTED; /* and nothing registered, as the header promises */
    uint64_t total;
    ret = event_total(&total);
    if (ret != NVML_SUCCESS)
        return ret;
    pthread_mutex_lock(&s->lock);
    if (s->mask[c.gpu] == 0)
        s->since[c.gpu] = total;
    s->mask[c.gpu] |= eventTypes;
    s->lost_seq = 1; /* the set changed: look at its GPUs afresh */
    pthread_mutex_unlock(&s->lock);
    return NVML_SUCCESS;
}

/* The next registered event after the set's cursor; NOT_FOUND when there is none yet. */
static nvmlReturn_t next_event(struct nvmlEventSet_st *s, nvmlEventData_t *data)
{
    uint64_t total;
    nvmlReturn_t ret = event_total(&total);
    if (ret != NVML_SUCCESS)
        return ret;
    if (total > VGPU_EVENT_CAPACITY && s->cursor < total - VGPU_EVENT_CAPACITY)
        s->cursor = total - VGPU_EVENT_CAPACITY; /* the ring has moved on: those are gone */
    while (s->cursor < total) {
        uint64_t n = s->cursor + 1;
        struct vgpu_event e;
        ret = vgpu_read_event(n, &e, &total);
        if (ret != NVML_SUCCESS && ret != NVML_ERROR_NOT_FOUND)
            return ret;
        s->cursor = n;
        if (ret == NVML_ERROR_NOT_FOUND || e.gpu >= VGPU_MAX_GPUS)
            continue;
        /* nvml.h: in MIG mode events of the instances are reported "only if the caller has appropriate
         * privileges. In absence of required privileges, only the events which affect all the instances
         * (i.e. the whole device) are reported." */
        if (e.gpu_instance_id != VGPU_NO_INSTANCE && !vgpu_privileged())
            continue;
        if ((s->mask[e.gpu] & e.event_type) && n > s->since[e.gpu]) {
            data->device = vgpu_gpu_handle(e.gpu);
            data->eventType = e.event_type;
            data->eventData = e.event_data;
            data->gpuInstanceId = e.gpu_instance_id;
            data->computeInstanceId = e.compute_instance_id;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Whether a registered GPU is lost. Worked out again only when the state file has changed: reading
 * every registered GPU's record at each look would cost more CPU than everything else the caller does. */
static int registered_gpu_lost(struct nvmlEventSet_st *s)
{
    uint64_t seq = vgpu_state_seq();
    if (seq == s->lost_seq)
        return s->lost;
    int lost = 0;
    for (unsigned int g = 0; g < VGPU_MAX_GPUS && !lost; g++) {
        struct vgpu_gpu rec;
        lost = s->mask[g] != 0 && vgpu_read_gpu(g, &rec) == NVML_SUCCESS && (rec.flags & VGPU_F_LOST);
    }
    if ((seq & 1) == 0 && vgpu_state_seq() == seq) { /* no write in between: the answer holds until the next */
        s->lost_seq = seq;
        s->lost = lost;
    }
    return lost;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!vgpu_initialized())
        return NVML_ERROR_UNINITIALIZED;
    struct nvmlEventSet_st *s = find_set(set, 0);
    if (data == NULL || s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t deadline = vgpu_now_ns() + (uint64_t)timeoutms * 1000000ull;
    for (;;) {
        uint64_t seen = vgpu_state_seq(); /* before looking: a write after it ends the sleep below at once */
        pthread_mutex_lock(&s->lock);
        nvmlReturn_t ret = next_event(s, data);
        int lost = ret == NVML_ERROR_NOT_FOUND && registered_gpu_lost(s);
        pthread_mutex_unlock(&s->lock);
        if (ret != NVML_ERROR_NOT_FOUND)
            return ret;
        if (lost) /* queued events first; then a GPU that fell off ends the wait */
            return NVML_ERROR_GPU_IS_LOST;
        uint64_t now = vgpu_now_ns();
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        uint64_t left_us = (deadline - now) / 1000 + 1;
        vgpu_wait_change_us(seen, left_us > UINT32_MAX ? UINT32_MAX : (unsigned int)left_us);
    }
}

/* The unversioned call fills the original, shorter event record: no instance ids. */
NVML_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    nvmlEventData_t full;
    nvmlReturn_t ret = nvmlEventSetWait_v2(set, data == NULL ? NULL : &full, timeoutms);
    if (ret == NVML_SUCCESS) {
        data->device = full.device;
        data->eventType = full.eventType;
        data->eventData = full.eventData;
    }
    return ret;
}
