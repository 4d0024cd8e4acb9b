/* proj/vulkan: the `vulkan` projection backend — the frozen projections on a GPU (or any
 * Vulkan 1.0 compute device) through Vulkan compute, behind the service's vtable like host.
 *
 *   - The loader (libvulkan.so.1) is opened at run time (dlopen), so the library carries no
 *     link to it: a machine without Vulkan runs the CPU backends, and this one says why not.
 *   - One compute shader (shaders/gemm.comp), compiled to SPIR-V by glslc at build time once
 *     per resident type and embedded here: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K.
 *     Other types are unsupported: the planner routes them to the CPU.
 *   - A weight is uploaded once, at its first request, in its resident bytes (the type the
 *     service's precision policy gave it), in whole rows split across as many buffers as the
 *     device's maxStorageBufferRange asks (lavapipe and many phone GPUs: 128 MiB, less than a
 *     large vocabulary's head). FWD X·Wᵀ and BWD dY·W read the same buffers; BWD adds the
 *     parts' contributions one after another, each dispatch starting from the sums so far, so
 *     the split changes no bit.
 *   - Activations and outputs go through two host-visible buffers; a request larger than one
 *     buffer runs in row chunks (every row is computed the same way at any T: any_T). Under
 *     the service's FP16 wire the activations cross as FP16 (half the bytes; the service has
 *     already scaled and rounded them); the outputs come back in FP32 and the service rounds.
 *   - run() records the dispatches, submits them and waits on a fence. It is called by the
 *     service's dispatcher thread, so nl_proj_submit returns at once and the caller's CPU work
 *     (the LoRA branch) overlaps the GPU; one request is in flight at a time, as the service
 *     guarantees.
 *
 * Without NL_HAVE_VULKAN (CMake found no Vulkan headers or no glslc) only the query functions
 * of vulkan.h are built, and they say so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"
#include "proj/vulkan.h"
#include "util/util.h"

#if !defined(NL_HAVE_VULKAN)

int nl_proj_vulkan_available(char *why, size_t cap) {
    if (why && cap)
        snprintf(
            why, cap,
            "this build has no Vulkan backend (CMake left it out: no Vulkan headers, no glslc or -DNL_VULKAN=OFF)");
    return 0;
}
int nl_proj_vulkan_list(char *buf, size_t cap) {
    (void)buf;
    (void)cap;
    return nl_err(
        "vulkan: this build has no Vulkan backend (CMake left it out: no Vulkan headers, no glslc or -DNL_VULKAN=OFF)");
}
const char *nl_proj_vulkan_device_kind(const void *ctx) {
    (void)ctx;
    return "none";
}
const char *nl_proj_vulkan_device_name(const void *ctx) {
    (void)ctx;
    return "none";
}
uint64_t nl_proj_vulkan_buffer_limit(const void *ctx) {
    (void)ctx;
    return 0;
}
int nl_proj_vulkan_set_buffer_limit(void *ctx, uint64_t bytes) {
    (void)ctx;
    (void)bytes;
    return nl_err("vulkan: this build has no Vulkan backend");
}
int nl_proj_vulkan_weight_parts(const void *ctx, const nl_proj_weight *w) {
    (void)ctx;
    (void)w;
    return 0;
}
uint64_t nl_proj_vulkan_uploaded_bytes(const void *ctx, int *n_uploads) {
    (void)ctx;
    if (n_uploads) *n_uploads = 0;
    return 0;
}
uint64_t nl_proj_vulkan_io_bytes(const void *ctx, uint64_t *out_bytes) {
    (void)ctx;
    if (out_bytes) *out_bytes = 0;
    return 0;
}

#else

#include <dlfcn.h>

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

/* ---- the embedded shaders (glslc -mfmt=c: a brace-enclosed list of SPIR-V words) ---- */

static const uint32_t spv_f32[] =
#include "spv/gemm_f32.inc"
    ;
static const uint32_t spv_f16[] =
#include "spv/gemm_f16.inc"
    ;
static const uint32_t spv_bf16[] =
#include "spv/gemm_bf16.inc"
    ;
static const uint32_t spv_q8_0[] =
#include "spv/gemm_q8_0.inc"
    ;
static const uint32_t spv_q4_0[] =
#include "spv/gemm_q4_0.inc"
    ;
static const uint32_t spv_q4_1[] =
#include "spv/gemm_q4_1.inc"
    ;
static const uint32_t spv_q5_0[] =
#include "spv/gemm_q5_0.inc"
    ;
static const uint32_t spv_q4_k[] =
#include "spv/gemm_q4_k.inc"
    ;
static const uint32_t spv_q6_k[] =
#include "spv/gemm_q6_k.inc"
    ;

static const struct {
    int type;
    const uint32_t *code;
    size_t bytes;
} shaders[] = {
    {NL_TYPE_F32, spv_f32, sizeof spv_f32},    {NL_TYPE_F16, spv_f16, sizeof spv_f16},
    {NL_TYPE_BF16, spv_bf16, sizeof spv_bf16}, {NL_TYPE_Q8_0, spv_q8_0, sizeof spv_q8_0},
    {NL_TYPE_Q4_0, spv_q4_0, sizeof spv_q4_0}, {NL_TYPE_Q4_1, spv_q4_1, sizeof spv_q4_1},
    {NL_TYPE_Q5_0, spv_q5_0, sizeof spv_q5_0}, {NL_TYPE_Q4_K, spv_q4_k, sizeof spv_q4_k},
    {NL_TYPE_Q6_K, spv_q6_k, sizeof spv_q6_k},
};
#define N_SHADERS ((int)(sizeof shaders / sizeof *shaders))

static int shader_of(int type) {
    for (int i = 0; i < N_SHADERS; i++)
        if (shaders[i].type == type) return i;
    return -1;
}

/* the shader's tile (gemm.comp: BO outputs x BT rows a work group) and push constants */
#define TILE_O 64
#define TILE_T 32
typedef struct {
    uint32_t T, I, O, ldx, ldy, xoff, yoff, rowb, dir, accum, xh;
} push_consts;

/* ---- the entry points, loaded from the loader ---- */

/* an X-macro list, laid out by hand (clang-format splits it differently on each pass) */
// clang-format off
#define VK_INSTANCE_FNS(X)                                                                          \
    X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)              \
    X(vkGetPhysicalDeviceQueueFamilyProperties) X(vkGetPhysicalDeviceMemoryProperties) X(vkCreateDevice) \
    X(vkGetDeviceProcAddr)
// clang-format on
/* an X-macro list, laid out by hand (clang-format splits it differently on each pass) */
// clang-format off
#define VK_DEVICE_FNS(X)                                                                             \
    X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer)                        \
    X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory)         \
    X(vkMapMemory) X(vkUnmapMemory) X(vkCreateShaderModule) X(vkDestroyShaderModule)                   \
    X(vkCreateDescriptorSetLayout) X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout)           \
    X(vkDestroyPipelineLayout) X(vkCreateComputePipelines) X(vkDestroyPipeline)                        \
    X(vkCreateDescriptorPool) X(vkDestroyDescriptorPool) X(vkResetDescriptorPool)                      \
    X(vkAllocateDescriptorSets) X(vkUpdateDescriptorSets) X(vkCreateCommandPool) X(vkDestroyCommandPool) \
    X(vkAllocateCommandBuffers) X(vkBeginCommandBuffer) X(vkEndCommandBuffer) X(vkResetCommandBuffer)  \
    X(vkCmdBindPipeline) X(vkCmdBindDescriptorSets) X(vkCmdPushConstants) X(vkCmdDispatch)             \
    X(vkCmdPipelineBarrier) X(vkCmdCopyBuffer) X(vkCreateFence) X(vkDestroyFence) X(vkResetFences)     \
    X(vkWaitForFences) X(vkQueueSubmit) X(vkDeviceWaitIdle)
// clang-format on

#define DECL_FN(name) PFN_##name name;

typedef struct {
    void *lib;
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    PFN_vkCreateInstance vkCreateInstance;
    PFN_vkGetPhysicalDeviceProperties2 vkGetPhysicalDeviceProperties2; /* Vulkan 1.1; may be NULL */
    VK_INSTANCE_FNS(DECL_FN)
    VK_DEVICE_FNS(DECL_FN)
    VkInstance inst;
    uint32_t inst_api;
} vk_loader;

typedef struct {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceSize size;
    void *map; /* host-visible buffers: mapped for their lifetime */
} vk_buf;

typedef struct {
    const void *data; /* the key: the resident bytes, their type and shape */
    int type;
    int64_t n_in, n_out;
    uint64_t sample; /* sample_hash of the bytes when uploaded */
    int n_parts;
    int64_t *row0; /* [n_parts + 1] first row of each part */
    vk_buf *part;  /* [n_parts] */
} vk_weight;

typedef struct {
    vk_loader L;
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    VkPhysicalDeviceMemoryProperties mp;
    VkPhysicalDeviceProperties props;
    char driver[256];
    int index;                 /* the device's index in vkEnumeratePhysicalDevices */
    uint64_t limit;            /* bytes one binding may hold (maxStorageBufferRange or lower) */
    int force_staging;         /* NL_VULKAN_STAGING=1: weights through a staging copy */
    int wire16;                /* the service runs the FP16 wire: X crosses as FP16 */
    uint64_t x_bytes, y_bytes; /* activations sent, outputs read back */
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkPipeline pipe[N_SHADERS]; /* made at a type's first request */
    VkDescriptorPool dpool;
    uint32_t dpool_sets;
    VkDescriptorSet *sets;
    VkCommandPool cpool;
    VkCommandBuffer cb;
    VkFence fence;
    vk_buf x, y; /* host-visible activations and outputs */
    vk_weight *w;
    int n_w, cap_w;
    uint64_t uploaded;
    int n_uploads;
} vk_ctx;

static const char *vk_result_name(VkResult r) {
    switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    default: return "VkResult";
    }
}

#define VKCHECK(call, what)                                                                                            \
    do {                                                                                                               \
        VkResult r_ = (call);                                                                                          \
        if (r_ != VK_SUCCESS) return nl_err("vulkan: %s: %s (%d)", what, vk_result_name(r_), (int)r_);                 \
    } while (0)

/* ---- loader and instance ---- */

static void loader_close(vk_loader *L) {
    if (L->inst && L->vkDestroyInstance) L->vkDestroyInstance(L->inst, NULL);
    if (L->lib) dlclose(L->lib);
    memset(L, 0, sizeof *L);
}

static int loader_open(vk_loader *L) {
    memset(L, 0, sizeof *L);
    static const char *const names[] = {"libvulkan.so.1", "libvulkan.so", "libvulkan.1.dylib", "libMoltenVK.dylib",
                                        NULL};
    const char *err = "";
    for (int i = 0; names[i] && !L->lib; i++) {
        L->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!L->lib && i == 0) err = dlerror();
    }
    if (!L->lib) return nl_err("vulkan: no Vulkan loader (libvulkan.so.1: %s)", err ? err : "not found");
    L->vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(L->lib, "vkGetInstanceProcAddr");
    if (!L->vkGetInstanceProcAddr) {
        loader_close(L);
        return nl_err("vulkan: the loader has no vkGetInstanceProcAddr");
    }
    L->vkCreateInstance = (PFN_vkCreateInstance)L->vkGetInstanceProcAddr(NULL, "vkCreateInstance");
    PFN_vkEnumerateInstanceVersion ver =
        (PFN_vkEnumerateInstanceVersion)L->vkGetInstanceProcAddr(NULL, "vkEnumerateInstanceVersion");
    uint32_t api = VK_API_VERSION_1_0;
    if (ver && ver(&api) != VK_SUCCESS) api = VK_API_VERSION_1_0;
    /* 1.1 where the loader has it (vkGetPhysicalDeviceProperties2: the driver's name); the
     * shaders need only 1.0 */
    L->inst_api = api >= VK_API_VERSION_1_1 ? VK_API_VERSION_1_1 : VK_API_VERSION_1_0;
    if (!L->vkCreateInstance) {
        loader_close(L);
        return nl_err("vulkan: the loader has no vkCreateInstance");
    }
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "nightlora",
                             .pEngineName = "nightlora",
                             .apiVersion = L->inst_api};
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkResult r = L->vkCreateInstance(&ici, NULL, &L->inst);
    if (r != VK_SUCCESS) {
        L->inst = NULL;
        loader_close(L);
        return nl_err("vulkan: vkCreateInstance: %s (%d)", vk_result_name(r), (int)r);
    }
#define LOAD_INST(name)                                                                                                \
    L->name = (PFN_##name)L->vkGetInstanceProcAddr(L->inst, #name);                                                    \
    if (!L->name) {                                                                                                    \
        loader_close(L);                                                                                               \
        return nl_err("vulkan: the loader has no %s", #name);                                                          \
    }
    VK_INSTANCE_FNS(LOAD_INST)
#undef LOAD_INST
    if (L->inst_api >= VK_API_VERSION_1_1)
        L->vkGetPhysicalDeviceProperties2 =
            (PFN_vkGetPhysicalDeviceProperties2)L->vkGetInstanceProcAddr(L->inst, "vkGetPhysicalDeviceProperties2");
    return 0;
}

static const char *kind_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

/* the preference of the default choice: discrete, integrated, virtual, then the rest */
static int kind_rank(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
    }
}

static int compute_family(vk_loader *L, VkPhysicalDevice pd, uint32_t *fam) {
    uint32_t n = 0;
    L->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    VkQueueFamilyProperties qf[32];
    if (n > 32) n = 32;
    L->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, qf);
    /* a compute family without graphics first (a dedicated compute queue), else any */
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < n; i++)
            if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && qf[i].queueCount > 0 &&
                (pass == 1 || !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT))) {
                *fam = i;
                return 1;
            }
    return 0;
}

static void driver_of(vk_loader *L, VkPhysicalDevice pd, const VkPhysicalDeviceProperties *p, char *buf, size_t cap) {
    if (L->vkGetPhysicalDeviceProperties2 && p->apiVersion >= VK_API_VERSION_1_2) {
        VkPhysicalDeviceDriverProperties dp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
        VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &dp};
        L->vkGetPhysicalDeviceProperties2(pd, &p2);
        if (dp.driverName[0]) {
            snprintf(buf, cap, "%.100s %.120s", dp.driverName, dp.driverInfo);
            return;
        }
    }
    snprintf(buf, cap, "driver version 0x%x", p->driverVersion);
}

#define MAX_DEVICES 16

static int enumerate(vk_loader *L, VkPhysicalDevice *pd, uint32_t *n) {
    *n = MAX_DEVICES;
    VkResult r = L->vkEnumeratePhysicalDevices(L->inst, n, pd);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
        return nl_err("vulkan: vkEnumeratePhysicalDevices: %s", vk_result_name(r));
    if (*n == 0) return nl_err("vulkan: no Vulkan device (the loader found no driver with a device)");
    return 0;
}

int nl_proj_vulkan_list(char *buf, size_t cap) {
    vk_loader L;
    if (loader_open(&L)) return -1;
    VkPhysicalDevice pd[MAX_DEVICES];
    uint32_t n;
    if (enumerate(&L, pd, &n)) {
        loader_close(&L);
        return -1;
    }
    size_t len = 0;
    if (cap) buf[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        L.vkGetPhysicalDeviceProperties(pd[i], &p);
        char drv[256];
        driver_of(&L, pd[i], &p, drv, sizeof drv);
        uint32_t fam;
        const int ok = compute_family(&L, pd[i], &fam);
        int k = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, "%s%u: %s, %s, %s, Vulkan %u.%u.%u%s",
                         len ? "\n" : "", i, p.deviceName, kind_name(p.deviceType), drv,
                         VK_API_VERSION_MAJOR(p.apiVersion), VK_API_VERSION_MINOR(p.apiVersion),
                         VK_API_VERSION_PATCH(p.apiVersion), ok ? "" : " (no compute queue)");
        len += (size_t)k;
    }
    loader_close(&L);
    return (int)len;
}

int nl_proj_vulkan_available(char *why, size_t cap) {
    vk_loader L;
    if (loader_open(&L)) {
        if (why && cap) snprintf(why, cap, "%s", nl_last_error());
        return 0;
    }
    VkPhysicalDevice pd[MAX_DEVICES];
    uint32_t n;
    int ok = 0;
    if (enumerate(&L, pd, &n) == 0) {
        for (uint32_t i = 0; i < n && !ok; i++) {
            uint32_t fam;
            ok = compute_family(&L, pd[i], &fam);
        }
        if (!ok) nl_err("vulkan: no device with a compute queue");
    }
    if (!ok && why && cap) snprintf(why, cap, "%s", nl_last_error());
    loader_close(&L);
    return ok;
}

/* ---- memory and buffers ---- */

static int mem_type(const vk_ctx *c, uint32_t bits, VkMemoryPropertyFlags want) {
    for (uint32_t i = 0; i < c->mp.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (c->mp.memoryTypes[i].propertyFlags & want) == want) return (int)i;
    return -1;
}

static void buf_free(vk_ctx *c, vk_buf *b) {
    if (b->map) c->L.vkUnmapMemory(c->dev, b->mem);
    if (b->buf) c->L.vkDestroyBuffer(c->dev, b->buf, NULL);
    if (b->mem) c->L.vkFreeMemory(c->dev, b->mem, NULL);
    memset(b, 0, sizeof *b);
}

/* A buffer of `size` bytes in the first memory type that has all of one of `prefs` (tried in
 * order; a failed allocation tries the next), mapped when host-visible. */
static int buf_new(vk_ctx *c, vk_buf *b, VkDeviceSize size, VkBufferUsageFlags usage,
                   const VkMemoryPropertyFlags *prefs, int n_prefs, const char *what) {
    memset(b, 0, sizeof *b);
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                             .size = size,
                             .usage = usage,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VKCHECK(c->L.vkCreateBuffer(c->dev, &bi, NULL, &b->buf), what);
    VkMemoryRequirements req;
    c->L.vkGetBufferMemoryRequirements(c->dev, b->buf, &req);
    VkResult last = VK_ERROR_OUT_OF_DEVICE_MEMORY;
    for (int p = 0; p < n_prefs; p++) {
        const int t = mem_type(c, req.memoryTypeBits, prefs[p]);
        if (t < 0) continue;
        VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                   .allocationSize = req.size,
                                   .memoryTypeIndex = (uint32_t)t};
        last = c->L.vkAllocateMemory(c->dev, &ai, NULL, &b->mem);
        if (last != VK_SUCCESS) {
            b->mem = NULL;
            continue;
        }
        if (c->L.vkBindBufferMemory(c->dev, b->buf, b->mem, 0) != VK_SUCCESS) break;
        if (c->mp.memoryTypes[t].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
            if (c->L.vkMapMemory(c->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map) != VK_SUCCESS) break;
        }
        b->size = size;
        return 0;
    }
    buf_free(c, b);
    return nl_err("vulkan: %s: cannot allocate %llu bytes (%s)", what, (unsigned long long)size, vk_result_name(last));
}

static const VkMemoryPropertyFlags host_prefs[] = {
    VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT | VK_MEMORY_PROPERTY_HOST_CACHED_BIT,
    VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
};

/* the activation buffer *b at least `need` bytes (grown by half again, within the limit) */
static int io_reserve(vk_ctx *c, vk_buf *b, VkDeviceSize need, const char *what) {
    if (b->buf && b->size >= need) return 0;
    VkDeviceSize size = need + need / 2;
    if (size > c->limit) size = c->limit;
    if (size < 4096) size = 4096 < c->limit ? 4096 : c->limit;
    buf_free(c, b);
    return buf_new(c, b, size, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, host_prefs, 2, what);
}

/* ---- one submission, waited for ---- */

static int cb_begin(vk_ctx *c) {
    VKCHECK(c->L.vkResetCommandBuffer(c->cb, 0), "vkResetCommandBuffer");
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VKCHECK(c->L.vkBeginCommandBuffer(c->cb, &bi), "vkBeginCommandBuffer");
    return 0;
}

static int cb_submit_wait(vk_ctx *c) {
    VKCHECK(c->L.vkEndCommandBuffer(c->cb), "vkEndCommandBuffer");
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &c->cb};
    VKCHECK(c->L.vkQueueSubmit(c->queue, 1, &si, c->fence), "vkQueueSubmit");
    VKCHECK(c->L.vkWaitForFences(c->dev, 1, &c->fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    VKCHECK(c->L.vkResetFences(c->dev, 1, &c->fence), "vkResetFences");
    return 0;
}

/* ---- context ---- */

static void weight_free(vk_ctx *c, vk_weight *w) {
    for (int p = 0; p < w->n_parts; p++) buf_free(c, &w->part[p]);
    free(w->part);
    free(w->row0);
    memset(w, 0, sizeof *w);
}

static void drop_weights(vk_ctx *c) {
    for (int i = 0; i < c->n_w; i++) weight_free(c, &c->w[i]);
    c->n_w = 0;
}

static void vk_free_ctx(void *ctx) {
    vk_ctx *c = ctx;
    if (!c) return;
    if (c->dev) {
        c->L.vkDeviceWaitIdle(c->dev);
        drop_weights(c);
        free(c->w);
        buf_free(c, &c->x);
        buf_free(c, &c->y);
        for (int i = 0; i < N_SHADERS; i++)
            if (c->pipe[i]) c->L.vkDestroyPipeline(c->dev, c->pipe[i], NULL);
        if (c->layout) c->L.vkDestroyPipelineLayout(c->dev, c->layout, NULL);
        if (c->dsl) c->L.vkDestroyDescriptorSetLayout(c->dev, c->dsl, NULL);
        if (c->dpool) c->L.vkDestroyDescriptorPool(c->dev, c->dpool, NULL);
        if (c->fence) c->L.vkDestroyFence(c->dev, c->fence, NULL);
        if (c->cpool) c->L.vkDestroyCommandPool(c->dev, c->cpool, NULL);
        c->L.vkDestroyDevice(c->dev, NULL);
    }
    free(c->sets);
    loader_close(&c->L);
    free(c);
}

/* "0", "1", ...: that device; NULL or "auto": the first discrete GPU, else integrated, virtual,
 * then any (a CPU driver such as lavapipe last). */
static int pick_device(vk_ctx *c, const char *device) {
    VkPhysicalDevice pd[MAX_DEVICES];
    uint32_t n;
    if (enumerate(&c->L, pd, &n)) return -1;
    int want = -1;
    if (device && *device && strcmp(device, "auto") != 0) {
        char *end;
        long v = strtol(device, &end, 10);
        if (*end || end == device || v < 0)
            return nl_err("vulkan: device \"%s\": expected a device index (0, 1, ...) or auto", device);
        if (v >= (long)n) {
            char list[1024];
            nl_proj_vulkan_list(list, sizeof list);
            return nl_err("vulkan: device %ld: this machine has %u Vulkan device%s (%s)", v, n, n == 1 ? "" : "s",
                          list);
        }
        want = (int)v;
    }
    int best = -1, best_rank = 99;
    for (uint32_t i = 0; i < n; i++) {
        if (want >= 0 && (int)i != want) continue;
        VkPhysicalDeviceProperties p;
        c->L.vkGetPhysicalDeviceProperties(pd[i], &p);
        uint32_t fam;
        if (!compute_family(&c->L, pd[i], &fam)) {
            if (want >= 0) return nl_err("vulkan: device %d (%s) has no compute queue", want, p.deviceName);
            continue;
        }
        if (kind_rank(p.deviceType) < best_rank) {
            best = (int)i;
            best_rank = kind_rank(p.deviceType);
        }
    }
    if (best < 0) return nl_err("vulkan: no device with a compute queue");
    c->index = best;
    c->pd = pd[best];
    c->L.vkGetPhysicalDeviceProperties(c->pd, &c->props);
    compute_family(&c->L, c->pd, &c->qfam);
    driver_of(&c->L, c->pd, &c->props, c->driver, sizeof c->driver);
    c->L.vkGetPhysicalDeviceMemoryProperties(c->pd, &c->mp);
    return 0;
}

static int device_setup(vk_ctx *c) {
    const float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                  .queueFamilyIndex = c->qfam,
                                  .queueCount = 1,
                                  .pQueuePriorities = &prio};
    VkDeviceCreateInfo di = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1, .pQueueCreateInfos = &qi};
    VKCHECK(c->L.vkCreateDevice(c->pd, &di, NULL, &c->dev), "vkCreateDevice");
#define LOAD_DEV(name)                                                                                                 \
    c->L.name = (PFN_##name)c->L.vkGetDeviceProcAddr(c->dev, #name);                                                   \
    if (!c->L.name) return nl_err("vulkan: the driver has no %s", #name);
    VK_DEVICE_FNS(LOAD_DEV)
#undef LOAD_DEV
    c->L.vkGetDeviceQueue(c->dev, c->qfam, 0, &c->queue);

    const VkPhysicalDeviceLimits *lim = &c->props.limits;
    if (lim->maxComputeSharedMemorySize < (TILE_T + TILE_O) * 33 * 4 || lim->maxComputeWorkGroupInvocations < 128)
        return nl_err("vulkan: %s: the compute limits are below the shader's tile", c->props.deviceName);
    c->limit = lim->maxStorageBufferRange / 4 * 4;

    VkDescriptorSetLayoutBinding b[3];
    for (int i = 0; i < 3; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = (uint32_t)i,
                                              .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1,
                                              .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo dli = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, .bindingCount = 3, .pBindings = b};
    VKCHECK(c->L.vkCreateDescriptorSetLayout(c->dev, &dli, NULL, &c->dsl), "vkCreateDescriptorSetLayout");
    VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = sizeof(push_consts)};
    VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                      .setLayoutCount = 1,
                                      .pSetLayouts = &c->dsl,
                                      .pushConstantRangeCount = 1,
                                      .pPushConstantRanges = &pr};
    VKCHECK(c->L.vkCreatePipelineLayout(c->dev, &pli, NULL, &c->layout), "vkCreatePipelineLayout");
    VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = c->qfam};
    VKCHECK(c->L.vkCreateCommandPool(c->dev, &cpi, NULL, &c->cpool), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                       .commandPool = c->cpool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                       .commandBufferCount = 1};
    VKCHECK(c->L.vkAllocateCommandBuffers(c->dev, &cai, &c->cb), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VKCHECK(c->L.vkCreateFence(c->dev, &fi, NULL, &c->fence), "vkCreateFence");
    return 0;
}

static int vk_open(void **out, const char *compute, const char *device) {
    *out = NULL;
    /* the arithmetic is FP32 whatever a known mode asks (as ref); an unknown one is refused */
    if (nl_proj_compute_known(compute)) return -1;
    vk_ctx *c = nl_calloc(1, sizeof *c);
    if (!c) return -1;
    const char *st = getenv("NL_VULKAN_STAGING");
    c->force_staging = st && !strcmp(st, "1");
    if (loader_open(&c->L) || pick_device(c, device) || device_setup(c)) {
        vk_free_ctx(c);
        return -1;
    }
    *out = c;
    return 0;
}

static int vk_init(void **ctx, int n_threads, const char *compute) {
    (void)n_threads; /* the device's parallelism, not the service's threads */
    return vk_open(ctx, compute, NULL);
}

static int vk_init_device(void **ctx, int n_threads, const char *compute, const char *device) {
    (void)n_threads;
    return vk_open(ctx, compute, device);
}

/* ---- weights on the device ---- */

/* A weight is known by its bytes' address, type and shape (the service's weights outlive its
 * backend). A hash of 18 samples of 64 bytes (the first, the last, 16 between) guards against
 * an address reused for other bytes (a weight freed and another allocated in its place): a
 * mismatch uploads it again. It costs ~1 kB of reading a request. */
static uint64_t sample_hash(const nl_proj_weight *w) {
    const size_t n = nl_row_bytes(w->type, w->n_in) * (size_t)w->n_out;
    const uint8_t *p = w->data;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (int s = 0; s < 18; s++) {
        size_t off = s == 0 ? 0 : s == 17 ? (n > 64 ? n - 64 : 0) : n / 17 * (size_t)s;
        const size_t len = n - off < 64 ? n - off : 64;
        for (size_t i = 0; i < len; i++) h = (h ^ p[off + i]) * 0x100000001b3ull;
    }
    return h;
}

static vk_weight *find_weight(const vk_ctx *c, const nl_proj_weight *w) {
    for (int i = 0; i < c->n_w; i++) {
        vk_weight *v = &c->w[i];
        if (v->data == w->data && v->type == w->type && v->n_in == w->n_in && v->n_out == w->n_out) return v;
    }
    return NULL;
}

/* bytes [0, n) of src into the device buffer b: mapped, or through a staging copy */
static int upload(vk_ctx *c, vk_buf *b, const uint8_t *src, size_t n) {
    if (b->map) {
        memcpy(b->map, src, n);
        return 0;
    }
    const size_t chunk = n < ((size_t)64 << 20) ? n : ((size_t)64 << 20);
    vk_buf st;
    if (buf_new(c, &st, chunk, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, host_prefs + 1, 1, "staging buffer")) return -1;
    int rc = 0;
    for (size_t off = 0; off < n && rc == 0; off += chunk) {
        const size_t len = n - off < chunk ? n - off : chunk;
        memcpy(st.map, src + off, len);
        VkBufferCopy cp = {.srcOffset = 0, .dstOffset = off, .size = len};
        if (cb_begin(c)) rc = -1;
        if (rc == 0) {
            c->L.vkCmdCopyBuffer(c->cb, st.buf, b->buf, 1, &cp);
            rc = cb_submit_wait(c);
        }
    }
    buf_free(c, &st);
    return rc;
}

static int64_t rows_per_part(const vk_ctx *c, size_t rb) {
    /* whole rows; the buffer rounded up to 4 bytes (the shader reads 32-bit words) */
    return (int64_t)((c->limit - 4) / rb);
}

static vk_weight *ensure_weight(vk_ctx *c, const nl_proj_weight *w) {
    const uint64_t h = sample_hash(w);
    vk_weight *v = find_weight(c, w);
    if (v && v->sample == h) return v;
    if (v) { /* other bytes at a known address: drop the old upload */
        c->L.vkDeviceWaitIdle(c->dev);
        weight_free(c, v);
        *v = c->w[--c->n_w];
    }
    if (c->n_w == c->cap_w) {
        int cap = c->cap_w ? 2 * c->cap_w : 32;
        vk_weight *nw = realloc(c->w, sizeof *nw * (size_t)cap);
        if (!nw) {
            nl_err("vulkan: out of memory");
            return NULL;
        }
        c->w = nw;
        c->cap_w = cap;
    }
    v = &c->w[c->n_w];
    memset(v, 0, sizeof *v);
    const size_t rb = nl_row_bytes(w->type, w->n_in);
    const int64_t per = rows_per_part(c, rb);
    const int n_parts = (int)((w->n_out + per - 1) / per);
    v->row0 = nl_calloc((size_t)n_parts + 1, sizeof *v->row0);
    v->part = nl_calloc((size_t)n_parts, sizeof *v->part);
    if (!v->row0 || !v->part) {
        free(v->row0);
        free(v->part);
        return NULL;
    }
    /* parts of equal rows (the last may be shorter) */
    const int64_t each = (w->n_out + n_parts - 1) / n_parts;
    for (int p = 0; p <= n_parts; p++) v->row0[p] = (int64_t)p * each < w->n_out ? (int64_t)p * each : w->n_out;
    v->n_parts = n_parts;
    VkMemoryPropertyFlags prefs[3];
    int np = 0;
    if (!c->force_staging)
        prefs[np++] = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                      VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    prefs[np++] = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    prefs[np++] = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint64_t bytes = 0;
    for (int p = 0; p < n_parts; p++) {
        const size_t n = (size_t)(v->row0[p + 1] - v->row0[p]) * rb;
        char what[160];
        snprintf(what, sizeof what, "weight %.100s (part %d/%d)", w->name ? w->name : "?", p + 1, n_parts);
        if (buf_new(c, &v->part[p], (n + 3) / 4 * 4,
                    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, prefs, np, what) ||
            upload(c, &v->part[p], (const uint8_t *)w->data + (size_t)v->row0[p] * rb, n)) {
            v->n_parts = p + 1;
            weight_free(c, v);
            return NULL;
        }
        bytes += n;
    }
    v->data = w->data;
    v->type = w->type;
    v->n_in = w->n_in;
    v->n_out = w->n_out;
    v->sample = h;
    c->uploaded += bytes;
    c->n_uploads++;
    c->n_w++;
    return v;
}

static VkPipeline pipeline(vk_ctx *c, int si) {
    if (c->pipe[si]) return c->pipe[si];
    VkShaderModuleCreateInfo mi = {
        .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = shaders[si].bytes, .pCode = shaders[si].code};
    VkShaderModule mod;
    VkResult r = c->L.vkCreateShaderModule(c->dev, &mi, NULL, &mod);
    if (r != VK_SUCCESS) {
        nl_err("vulkan: vkCreateShaderModule (%s): %s", nl_type_name(shaders[si].type), vk_result_name(r));
        return NULL;
    }
    VkComputePipelineCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                                      .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                                                .module = mod,
                                                .pName = "main"},
                                      .layout = c->layout};
    r = c->L.vkCreateComputePipelines(c->dev, VK_NULL_HANDLE, 1, &pi, NULL, &c->pipe[si]);
    c->L.vkDestroyShaderModule(c->dev, mod, NULL);
    if (r != VK_SUCCESS) {
        c->pipe[si] = NULL;
        nl_err("vulkan: vkCreateComputePipelines (%s): %s", nl_type_name(shaders[si].type), vk_result_name(r));
        return NULL;
    }
    return c->pipe[si];
}

/* n descriptor sets (a pool made large enough, reset for every request) */
static int alloc_sets(vk_ctx *c, uint32_t n) {
    if (n > c->dpool_sets) {
        if (c->dpool) c->L.vkDestroyDescriptorPool(c->dev, c->dpool, NULL);
        c->dpool = NULL;
        c->dpool_sets = 0;
        uint32_t cap = n < 8 ? 8 : n;
        VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = 3 * cap};
        VkDescriptorPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                         .maxSets = cap,
                                         .poolSizeCount = 1,
                                         .pPoolSizes = &ps};
        VKCHECK(c->L.vkCreateDescriptorPool(c->dev, &pi, NULL, &c->dpool), "vkCreateDescriptorPool");
        VkDescriptorSet *s = realloc(c->sets, sizeof *s * cap);
        if (!s) return nl_err("vulkan: out of memory");
        c->sets = s;
        c->dpool_sets = cap;
    } else {
        VKCHECK(c->L.vkResetDescriptorPool(c->dev, c->dpool, 0), "vkResetDescriptorPool");
    }
    VkDescriptorSetLayout layouts[64];
    for (uint32_t i0 = 0; i0 < n; i0 += 64) {
        const uint32_t k = n - i0 < 64 ? n - i0 : 64;
        for (uint32_t i = 0; i < k; i++) layouts[i] = c->dsl;
        VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                          .descriptorPool = c->dpool,
                                          .descriptorSetCount = k,
                                          .pSetLayouts = layouts};
        VKCHECK(c->L.vkAllocateDescriptorSets(c->dev, &ai, c->sets + i0), "vkAllocateDescriptorSets");
    }
    return 0;
}

/* ---- the vtable ---- */

static int vk_supports(void *ctx, const nl_proj_weight *w, nl_dir dir, int T) {
    const vk_ctx *c = ctx;
    if (!c || !w || !w->data || T < 1 || (dir != NL_FWD && dir != NL_BWD)) return 0;
    if (shader_of(w->type) < 0) return 0;
    const nl_type_traits *tt = nl_type_get(w->type);
    if (!tt || w->n_in < 1 || w->n_out < 1 || w->n_in % tt->blck) return 0;
    if (w->n_in > (1 << 30) || w->n_out > (1 << 30)) return 0;
    const size_t rb = nl_row_bytes(w->type, w->n_in);
    if (rb + 4 > c->limit) return 0;
    /* one row of X and of Y must fit a buffer; the 32-bit indices of the shader must not wrap */
    const uint64_t widest = (uint64_t)(w->n_in > w->n_out ? w->n_in : w->n_out) * 4;
    if (widest > c->limit) return 0;
    if ((uint64_t)rows_per_part(c, rb) * rb > UINT32_MAX) return 0;
    return 1;
}

static int vk_run(void *ctx, const nl_proj_weight *w, nl_dir dir, const float *x, int T, float *y) {
    vk_ctx *c = ctx;
    const char *nm = w && w->name ? w->name : "?";
    if (!c) return nl_err("vulkan: run: no context");
    if (T == 0) return 0;
    if (!vk_supports(ctx, w, dir, T))
        return nl_err("vulkan: %s: unsupported weight (type %s, %lldx%lld)", nm, w ? nl_type_name(w->type) : "?",
                      w ? (long long)w->n_out : 0LL, w ? (long long)w->n_in : 0LL);
    if (!x || !y) return nl_err("vulkan: %s: NULL input or output", nm);
    const int si = shader_of(w->type);
    VkPipeline pipe = pipeline(c, si);
    if (!pipe) return -1;
    vk_weight *v = ensure_weight(c, w);
    if (!v) return nl_err_prefix("vulkan: %s", nm);
    const int64_t K = w->n_in, N = w->n_out;
    const int64_t nin = dir == NL_FWD ? K : N, nout = dir == NL_FWD ? N : K;
    /* rows a chunk: both buffers within the limit, the grid within the device's counts */
    int64_t tc = (int64_t)(c->limit / (uint64_t)(4 * (nin > nout ? nin : nout)));
    const int64_t gmax = (int64_t)c->props.limits.maxComputeWorkGroupCount[1] * TILE_T;
    if (tc > gmax) tc = gmax;
    if (tc > T) tc = T;
    const size_t xe = c->wire16 ? 2 : 4; /* bytes an activation */
    if (io_reserve(c, &c->x, (VkDeviceSize)((tc * nin * (int64_t)xe + 3) / 4 * 4), "activations") ||
        io_reserve(c, &c->y, (VkDeviceSize)(tc * nout * 4), "outputs"))
        return nl_err_prefix("vulkan: %s", nm);
    if (alloc_sets(c, (uint32_t)v->n_parts)) return -1;
    const size_t rb = nl_row_bytes(w->type, K);
    for (int p = 0; p < v->n_parts; p++) {
        VkDescriptorBufferInfo bi[3] = {
            {v->part[p].buf, 0, v->part[p].size}, {c->x.buf, 0, c->x.size}, {c->y.buf, 0, c->y.size}};
        VkWriteDescriptorSet ws[3];
        for (int i = 0; i < 3; i++)
            ws[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                           .dstSet = c->sets[p],
                                           .dstBinding = (uint32_t)i,
                                           .descriptorCount = 1,
                                           .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                           .pBufferInfo = &bi[i]};
        c->L.vkUpdateDescriptorSets(c->dev, 3, ws, 0, NULL);
    }
    for (int64_t t0 = 0; t0 < T; t0 += tc) {
        const int64_t rows = T - t0 < tc ? T - t0 : tc;
        const float *xr = x + (size_t)t0 * (size_t)nin;
        const size_t ne = (size_t)(rows * nin);
        if (c->wire16) { /* the wire's values are FP16 already: exact */
            uint16_t *h = c->x.map;
            for (size_t i = 0; i < ne; i++) h[i] = nl_f32_to_f16(xr[i]);
        } else {
            memcpy(c->x.map, xr, sizeof(float) * ne);
        }
        c->x_bytes += ne * xe;
        c->y_bytes += (uint64_t)(rows * nout) * 4;
        if (cb_begin(c)) return -1;
        c->L.vkCmdBindPipeline(c->cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
        for (int p = 0; p < v->n_parts; p++) {
            const uint32_t pr = (uint32_t)(v->row0[p + 1] - v->row0[p]);
            push_consts pc = {
                .T = (uint32_t)rows, .rowb = (uint32_t)rb, .dir = (uint32_t)dir, .xh = (uint32_t)c->wire16};
            if (dir == NL_FWD) {
                pc.I = (uint32_t)K;
                pc.O = pr;
                pc.ldx = (uint32_t)K;
                pc.ldy = (uint32_t)N;
                pc.yoff = (uint32_t)v->row0[p];
            } else {
                pc.I = pr;
                pc.O = (uint32_t)K;
                pc.ldx = (uint32_t)N;
                pc.ldy = (uint32_t)K;
                pc.xoff = (uint32_t)v->row0[p];
                pc.accum = p > 0;
                if (p > 0) { /* the previous part's sums are this one's start */
                    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
                    c->L.vkCmdPipelineBarrier(c->cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                              VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
                }
            }
            c->L.vkCmdBindDescriptorSets(c->cb, VK_PIPELINE_BIND_POINT_COMPUTE, c->layout, 0, 1, &c->sets[p], 0, NULL);
            c->L.vkCmdPushConstants(c->cb, c->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
            c->L.vkCmdDispatch(c->cb, (pc.O + TILE_O - 1) / TILE_O, (uint32_t)((rows + TILE_T - 1) / TILE_T), 1);
        }
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                              .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                              .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
        c->L.vkCmdPipelineBarrier(c->cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
                                  NULL, 0, NULL);
        if (cb_submit_wait(c)) return nl_err_prefix("vulkan: %s", nm);
        memcpy(y + (size_t)t0 * (size_t)nout, c->y.map, sizeof(float) * (size_t)(rows * nout));
    }
    return 0;
}

static int vk_describe(void *ctx, char *buf, size_t cap) {
    const vk_ctx *c = ctx;
    if (!c) return snprintf(buf, cap, "no vulkan context");
    const uint32_t a = c->props.apiVersion;
    return snprintf(buf, cap,
                    "f32 compute on device %d, %s (%s%s), %s, Vulkan %u.%u.%u; shaders for f32 f16 bf16 q8_0 q4_0 q4_1 "
                    "q5_0 q4_k q6_k",
                    c->index, c->props.deviceName, kind_name(c->props.deviceType),
                    c->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? ": a CPU driver" : "", c->driver,
                    VK_API_VERSION_MAJOR(a), VK_API_VERSION_MINOR(a), VK_API_VERSION_PATCH(a));
}

static void vk_wire_f16(void *ctx) {
    if (ctx) ((vk_ctx *)ctx)->wire16 = 1;
}

uint64_t nl_proj_vulkan_io_bytes(const void *ctx, uint64_t *out_bytes) {
    const vk_ctx *c = ctx;
    if (out_bytes) *out_bytes = c ? c->y_bytes : 0;
    return c ? c->x_bytes : 0;
}

static const char *vk_compute(const void *ctx) {
    (void)ctx;
    return "f32";
}

const char *nl_proj_vulkan_device_kind(const void *ctx) {
    return ctx ? kind_name(((const vk_ctx *)ctx)->props.deviceType) : "none";
}

const char *nl_proj_vulkan_device_name(const void *ctx) {
    return ctx ? ((const vk_ctx *)ctx)->props.deviceName : "none";
}

uint64_t nl_proj_vulkan_buffer_limit(const void *ctx) { return ctx ? ((const vk_ctx *)ctx)->limit : 0; }

int nl_proj_vulkan_set_buffer_limit(void *ctx, uint64_t bytes) {
    vk_ctx *c = ctx;
    if (!c) return nl_err("vulkan: set_buffer_limit: no context");
    const uint64_t dev = c->props.limits.maxStorageBufferRange / 4 * 4;
    if (bytes < 4096 || bytes > dev)
        return nl_err("vulkan: buffer limit %llu: expected 4096 .. %llu bytes (the device's maxStorageBufferRange)",
                      (unsigned long long)bytes, (unsigned long long)dev);
    c->L.vkDeviceWaitIdle(c->dev);
    drop_weights(c);
    buf_free(c, &c->x);
    buf_free(c, &c->y);
    c->limit = bytes / 4 * 4;
    return 0;
}

int nl_proj_vulkan_weight_parts(const void *ctx, const nl_proj_weight *w) {
    const vk_weight *v = ctx && w ? find_weight(ctx, w) : NULL;
    return v ? v->n_parts : 0;
}

uint64_t nl_proj_vulkan_uploaded_bytes(const void *ctx, int *n_uploads) {
    const vk_ctx *c = ctx;
    if (n_uploads) *n_uploads = c ? c->n_uploads : 0;
    return c ? c->uploaded : 0;
}

const nl_proj_backend nl_proj_backend_vulkan = {
    .name = "vulkan",
    .init = vk_init,
    .supports = vk_supports,
    .run = vk_run,
    .free = vk_free_ctx,
    .any_T = 1,
    .describe = vk_describe,
    .compute = vk_compute,
    .init_device = vk_init_device,
    .wire_f16 = vk_wire_f16,
};

#endif
