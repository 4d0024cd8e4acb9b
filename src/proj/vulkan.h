/* proj/vulkan: the `vulkan` projection backend (vulkan.c; built where CMake finds libvulkan's
 * headers and glslc: NL_HAVE_VULKAN). The backend is reached like any other, through
 * nl_proj_backend_find("vulkan") and the service; these are the few things its tests, the
 * benchmark and the CLI ask of it beyond the vtable. */
#ifndef NL_PROJ_VULKAN_H
#define NL_PROJ_VULKAN_H

#include <stddef.h>
#include <stdint.h>

#include "proj/proj.h"

#if defined(NL_HAVE_VULKAN)
extern const nl_proj_backend nl_proj_backend_vulkan;
#endif

/* 1 when a Vulkan device can be opened here (the loader found, an instance made, at least one
 * physical device with a compute queue), else 0 and why into buf. Built without the backend: 0. */
int nl_proj_vulkan_available(char *why, size_t cap);
/* The devices, one line each ("0: llvmpipe (LLVM 15.0.6, 256 bits), cpu, llvmpipe Mesa ..."),
 * into buf (NUL-terminated, like snprintf); -1 + nl_err when none can be listed. */
int nl_proj_vulkan_list(char *buf, size_t cap);
/* The device kind of an open context: "discrete", "integrated", "virtual", "cpu" or "other". */
const char *nl_proj_vulkan_device_kind(const void *ctx);
/* The device's name ("llvmpipe (LLVM 15.0.6, 256 bits)", ...). */
const char *nl_proj_vulkan_device_name(const void *ctx);
/* The largest storage buffer the context binds (the device's maxStorageBufferRange unless
 * lowered). Lowering it (tests: a head split across several buffers on any device) drops the
 * weights uploaded so far; they are uploaded again, split, at their next request. */
uint64_t nl_proj_vulkan_buffer_limit(const void *ctx);
int nl_proj_vulkan_set_buffer_limit(void *ctx, uint64_t bytes);
/* How many buffers a registered weight occupies on the device (0: not uploaded yet). */
int nl_proj_vulkan_weight_parts(const void *ctx, const nl_proj_weight *w);
/* Bytes of weights uploaded to the device, in total and how many uploads it took. */
uint64_t nl_proj_vulkan_uploaded_bytes(const void *ctx, int *n_uploads);
/* Bytes of activations sent to the device (FP16 under the wire, else FP32) and, in *out_bytes,
 * of outputs read back, since the context was made. */
uint64_t nl_proj_vulkan_io_bytes(const void *ctx, uint64_t *out_bytes);

#endif
