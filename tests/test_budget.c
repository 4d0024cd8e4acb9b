/* train/budget: /proc parsing, memory probes, and the keep/recompute planner checked against
 * an independent step-by-step simulation of forward + backward memory and brute force. */
#include <stdint.h>

#include "test.h"
#include "os/mem.h"
#include "train/budget.h"
#include "util/util.h"

/* Simulate the activation memory of a plan: forward 0..n-1 allocates each layer's bytes and
 * frees a dropped layer's at once; backward n-1..0 recomputes a dropped layer (allocates its
 * bytes), then frees that layer's bytes after its backward. Returns the peak. */
static uint64_t simulate(const uint64_t *b, int n, const unsigned char *keep) {
    uint64_t alive = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        alive += b[i];
        if (alive > peak) peak = alive;
        if (!keep[i]) alive -= b[i];
    }
    for (int i = n - 1; i >= 0; i--) {
        if (!keep[i]) alive += b[i];
        if (alive > peak) peak = alive;
        alive -= b[i];
    }
    return peak;
}

static void test_planner_cases(void) {
    unsigned char keep[16];
    nl_act_plan pl;
    /* everything fits */
    uint64_t u[6] = {10, 10, 10, 10, 10, 10};
    CHECK(nl_act_plan_layers(u, 6, 60, keep, &pl) == 0);
    CHECK(pl.n_kept == 6 && pl.kept_bytes == 60 && pl.peak_bytes == 60 && pl.fits);
    /* uniform layers, budget for 3.5: the last 3 are kept; the peak is 30, not 40 */
    CHECK(nl_act_plan_layers(u, 6, 35, keep, &pl) == 0);
    CHECK(!keep[0] && !keep[1] && !keep[2] && keep[3] && keep[4] && keep[5]);
    CHECK(pl.n_kept == 3 && pl.peak_bytes == 30 && pl.fits);
    CHECK(simulate(u, 6, keep) == 30);
    /* keeping the first 3 instead would peak at 40 (recompute on top of kept memory) */
    unsigned char early[6] = {1, 1, 1, 0, 0, 0};
    CHECK(simulate(u, 6, early) == 40);
    /* budget below one layer: nothing kept, does not fit */
    CHECK(nl_act_plan_layers(u, 6, 9, keep, &pl) == 0);
    CHECK(pl.n_kept == 0 && pl.peak_bytes == 10 && !pl.fits);
    /* uneven layers: a big layer is dropped, a small earlier one still fits below it */
    uint64_t v[5] = {5, 50, 5, 5, 20};
    CHECK(nl_act_plan_layers(v, 5, 60, keep, &pl) == 0);
    CHECK(keep[0] && !keep[1] && keep[2] && keep[3] && keep[4]);
    CHECK(pl.peak_bytes == 55 && pl.fits && pl.kept_bytes == 35);
    CHECK(simulate(v, 5, keep) == 55);
    /* ... but not when it would push the big layer's recompute over the budget */
    CHECK(nl_act_plan_layers(v, 5, 54, keep, &pl) == 0);
    CHECK(!keep[0] && !keep[1] && keep[2] && keep[3] && keep[4] && pl.peak_bytes == 50);
    /* zero layers */
    CHECK(nl_act_plan_layers(NULL, 0, 100, keep, &pl) == 0 && pl.n_kept == 0 && pl.fits);
    CHECK(nl_act_plan_layers(u, -1, 100, keep, &pl) == -1);
    /* huge values saturate instead of wrapping */
    uint64_t h[3] = {UINT64_MAX / 2, UINT64_MAX / 2, UINT64_MAX / 2};
    CHECK(nl_act_plan_layers(h, 3, UINT64_MAX, keep, &pl) == 0);
    CHECK(pl.n_kept == 2 && keep[1] && keep[2] && pl.fits);
}

/* Random small instances: the plan's reported peak equals the simulation, it fits whenever
 * every single layer fits, it keeps at least the longest fitting suffix, and it is within the
 * brute-force optimum's count (reported). */
static void test_planner_random(void) {
    int bad = 0, optimal = 0, total = 0;
    for (int t = 0; t < 400; t++) {
        int n = 1 + t % 9;
        uint64_t b[9], budget = (uint64_t)((nl_t_rand() + 1) * 60);
        int all_fit = 1;
        for (int i = 0; i < n; i++) {
            b[i] = 1 + (uint64_t)((nl_t_rand() + 1) * 15);
            if (b[i] > budget) all_fit = 0;
        }
        unsigned char keep[9];
        nl_act_plan pl;
        if (nl_act_plan_layers(b, n, budget, keep, &pl) != 0) bad++;
        if (pl.peak_bytes != simulate(b, n, keep)) bad++;
        if (all_fit && !pl.fits) bad++;
        /* longest suffix that fits */
        uint64_t s = 0;
        int suffix = 0;
        for (int i = n - 1; i >= 0 && s + b[i] <= budget; i--) s += b[i], suffix++;
        if (pl.n_kept < suffix) bad++;
        for (int i = n - suffix; i < n; i++)
            if (!keep[i]) bad++;
        /* brute force over all subsets */
        int best = 0;
        for (unsigned m = 0; m < (1u << n); m++) {
            unsigned char k[9];
            int c = 0;
            for (int i = 0; i < n; i++) c += k[i] = (unsigned char)((m >> i) & 1);
            if (all_fit && simulate(b, n, k) <= budget && c > best) best = c;
        }
        if (all_fit) {
            total++;
            if (pl.n_kept > best) bad++; /* impossible unless the simulation disagrees */
            if (pl.n_kept == best) optimal++;
        }
        /* deterministic */
        unsigned char again[9];
        nl_act_plan_layers(b, n, budget, again, NULL);
        if (memcmp(again, keep, (size_t)n) != 0) bad++;
    }
    CHECKF(bad == 0, "%d bad", bad);
    printf("planner: optimal kept count in %d of %d random cases\n", optimal, total);
    CHECK(optimal * 10 >= total * 9);
}

static void test_proc(void) {
    const char *txt = "MemTotal:       16303412 kB\nMemFree:          1234 kB\n"
                      "MemAvailable:   8000000 kB\nHugePages_Total:       0\nBad:   x kB\n"
                      "Big: 99999999999999999999 kB\n";
    CHECK(nl_proc_kb_field(txt, "MemAvailable") == 8000000LL * 1024);
    CHECK(nl_proc_kb_field(txt, "MemTotal") == 16303412LL * 1024);
    CHECK(nl_proc_kb_field(txt, "HugePages_Total") == 0);
    CHECK(nl_proc_kb_field(txt, "Mem") == -1); /* whole key only */
    CHECK(nl_proc_kb_field(txt, "Swap") == -1);
    CHECK(nl_proc_kb_field(txt, "Bad") == -1);
    CHECK(nl_proc_kb_field(txt, "Big") == -1);
    CHECK(nl_proc_kb_field("", "MemAvailable") == -1);

    int64_t avail = nl_mem_available_bytes();
    CHECK(avail > (1 << 20));
    int64_t peak0 = nl_peak_rss_bytes();
    CHECK(peak0 > 0 && nl_rss_bytes() > 0);
    size_t n = 48u << 20;
    volatile char *big = malloc(n);
    for (size_t i = 0; i < n; i += 4096) big[i] = (char)i;
    int64_t peak1 = nl_peak_rss_bytes();
    CHECKF(peak1 >= peak0 + (int64_t)(40u << 20), "peak %lld -> %lld", (long long)peak0, (long long)peak1);
    free((void *)big);
    /* a high-water mark stays up after the free (the kernel's RSS counters are batched per
     * thread, so allow a little slack) */
    CHECK(nl_peak_rss_bytes() >= peak1 - (int64_t)(1u << 20));

    CHECK(nl_act_budget_bytes(100, 1000, 10) == 100);
    CHECK(nl_act_budget_bytes(0, 1000, 10) == 990);
    CHECK(nl_act_budget_bytes(2000, 1000, 10) == 990);
    CHECK(nl_act_budget_bytes(2000, 5, 10) == 0);
    CHECK(nl_act_budget_bytes(0, -1, 10) == UINT64_MAX);
    CHECK(nl_act_budget_bytes(7, -1, 10) == 7);
}

int main(void) {
    test_planner_cases();
    test_planner_random();
    test_proc();
    return nl_t_done();
}
