/* train/budget: the activation keep/recompute planner. See budget.h. */
#include "train/budget.h"

#include "util/util.h"

uint64_t nl_act_budget_bytes(uint64_t cap, int64_t available, uint64_t reserve) {
    if (available < 0) return cap ? cap : UINT64_MAX;
    uint64_t a = (uint64_t)available > reserve ? (uint64_t)available - reserve : 0;
    return cap && cap < a ? cap : a;
}

/* Peak of a plan (budget.h), saturating at UINT64_MAX. */
static uint64_t sat_add(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

/* a + b <= limit, without overflow */
static int add_within(uint64_t a, uint64_t b, uint64_t limit) {
    uint64_t s;
    return nl_add_ok(a, b, &s) == 0 && s <= limit;
}

static uint64_t plan_peak(const uint64_t *b, int n, const unsigned char *keep, uint64_t *kept) {
    uint64_t below = 0, peak = 0;
    for (int j = 0; j < n; j++) {
        if (keep[j]) below = sat_add(below, b[j]);
        else {
            uint64_t r = sat_add(below, b[j]);
            if (r > peak) peak = r;
        }
    }
    if (below > peak) peak = below;
    if (kept) *kept = below;
    return peak;
}

int nl_act_plan_layers(const uint64_t *b, int n, uint64_t budget, unsigned char *keep, nl_act_plan *plan) {
    if (n < 0 || (n > 0 && (!b || !keep))) return nl_err("act plan: bad arguments");
    for (int i = 0; i < n; i++) keep[i] = 0;
    /* Layers are decided from the last down, so when deciding i every kept layer so far has
     * an index > i; the constraint of each dropped j > i is re-checked at every later keep. */
    uint64_t used = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (!add_within(used, b[i], budget)) continue;
        /* Keeping i adds b[i] to the recompute peak of every dropped j > i; a dropped j that
         * cannot fit even alone is infeasible whatever we do and does not block. */
        int ok = 1;
        uint64_t below = 0; /* kept bytes in (i, j) */
        for (int j = i + 1; j < n && ok; j++) {
            if (keep[j]) {
                below = sat_add(below, b[j]);
                continue;
            }
            if (b[j] > budget) continue;
            if (!add_within(below, b[i], budget) || !add_within(below + b[i], b[j], budget)) ok = 0;
        }
        if (!ok) continue;
        keep[i] = 1;
        used = sat_add(used, b[i]);
    }
    if (plan) {
        plan->n_kept = 0;
        for (int i = 0; i < n; i++) plan->n_kept += keep[i];
        plan->peak_bytes = plan_peak(b, n, keep, &plan->kept_bytes);
        /* a saturated peak means "more than 2^64 - 1": never fits */
        plan->fits = plan->peak_bytes <= budget && plan->peak_bytes != UINT64_MAX;
    }
    return 0;
}
