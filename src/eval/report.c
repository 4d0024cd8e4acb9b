/* eval/report: a training run's report as one self-contained HTML file (report.h). */
#include "eval/report.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "os/pacing.h"
#include "util/json.h"
#include "util/util.h"

/* ---- the log's rows ---- */

enum { HAS_SVC = 1, HAS_PAUSED = 2, HAS_LR = 4, HAS_GNORM = 8, HAS_JOULES = 16 };

typedef struct {
    int64_t step, tokens;
    double loss, seconds, service, paused, lr, gnorm, joules;
    unsigned has;
    unsigned pause_kind; /* NL_PAUSE_* ("pause_kind"; 0: not said, a log from before it was) */
    double t0;           /* the run's clock at the step's start, seconds (steps, pauses and evaluations) */
} step_row;

typedef struct {
    int64_t step, examples, tokens;
    double loss, accuracy, seconds; /* accuracy: a fraction, NAN when the row has none */
    double t0;
} eval_row;

typedef struct {
    const char *path;
    step_row *s;
    int ns, cap_s;
    eval_row *e;
    int ne, cap_e;
    int n_other;           /* rows of other kinds */
    char other_kinds[160]; /* their first keys, ", "-separated */
    int tail_line;         /* > 0: that last line had no newline and was no JSON: left out */
    double clock;
} run_log;

static void log_free(run_log *l) {
    free(l->s);
    free(l->e);
}

static int grow(void **p, int *cap, int n, size_t size) {
    if (n < *cap) return 0;
    int nc = *cap ? *cap * 2 : 256;
    void *q = realloc(*p, (size_t)nc * size);
    if (!q) return nl_err("out of memory reading the log");
    *p = q;
    *cap = nc;
    return 0;
}

/* "a string", "an array", "null", ... for messages. */
static const char *kind_of(const nl_json *v) {
    switch (v->type) {
    case NL_JSON_STRING: return "a string";
    case NL_JSON_NUMBER: return "a number";
    case NL_JSON_ARRAY: return "an array";
    case NL_JSON_OBJECT: return "an object";
    default: return nl_json_type_name(v->type);
    }
}

/* A row's member as a number: required or not (*has says whether it was there), finite, >= lo. */
static int row_num(const run_log *l, int line, const char *kind, const nl_json *row, const char *key, int required,
                   double lo, double *out, int *has) {
    const nl_json *v = nl_json_get(row, key);
    if (has) *has = 0;
    if (!v) return required ? nl_err("%s:%d: %s row without \"%s\"", l->path, line, kind, key) : 0;
    if (!nl_json_is_number(v))
        return nl_err("%s:%d:%zu: \"%s\" is %s, expected a number", l->path, line, v->offset + 1, key, kind_of(v));
    if (!(v->u.num.d >= lo))
        return nl_err("%s:%d:%zu: \"%s\" is %g, expected a number >= %g", l->path, line, v->offset + 1, key, v->u.num.d,
                      lo);
    *out = v->u.num.d;
    if (has) *has = 1;
    return 0;
}

static int row_int(const run_log *l, int line, const char *kind, const nl_json *row, const char *key, int required,
                   int64_t lo, int64_t *out) {
    const nl_json *v = nl_json_get(row, key);
    if (!v) return required ? nl_err("%s:%d: %s row without \"%s\"", l->path, line, kind, key) : 0;
    int64_t i;
    if (nl_json_int64(v, &i) != 0)
        return nl_err("%s:%d:%zu: \"%s\" is %s, expected an integer", l->path, line, v->offset + 1, key,
                      nl_json_is_number(v) ? "a fraction" : kind_of(v));
    if (i < lo)
        return nl_err("%s:%d:%zu: \"%s\" is %lld, expected an integer >= %lld", l->path, line, v->offset + 1, key,
                      (long long)i, (long long)lo);
    *out = i;
    return 0;
}

static int read_step(run_log *l, int line, const nl_json *row) {
    if (grow((void **)&l->s, &l->cap_s, l->ns, sizeof *l->s)) return -1;
    step_row r = {0};
    int h = 0;
    if (row_int(l, line, "a step", row, "step", 1, 1, &r.step) ||
        row_num(l, line, "a step", row, "loss", 1, -INFINITY, &r.loss, NULL) ||
        row_int(l, line, "a step", row, "tokens", 1, 0, &r.tokens) ||
        row_num(l, line, "a step", row, "seconds", 1, 0, &r.seconds, NULL))
        return -1;
    if (row_num(l, line, "a step", row, "service_seconds", 0, 0, &r.service, &h)) return -1;
    r.has |= h ? HAS_SVC : 0;
    if (row_num(l, line, "a step", row, "paused_seconds", 0, 0, &r.paused, &h)) return -1;
    r.has |= h ? HAS_PAUSED : 0;
    const nl_json *pk = nl_json_get(row, "pause_kind");
    if (pk && !(nl_json_is_string(pk) && (r.pause_kind = nl_pause_kind_parse(pk->u.str.s)) != 0))
        return nl_err("%s:%d:%zu: \"pause_kind\" is %s, expected \"thermal\", \"battery\" or \"thermal+battery\"",
                      l->path, line, pk->offset + 1, nl_json_is_string(pk) ? "another string" : kind_of(pk));
    if (row_num(l, line, "a step", row, "lr", 0, 0, &r.lr, &h)) return -1;
    r.has |= h ? HAS_LR : 0;
    if (row_num(l, line, "a step", row, "grad_norm", 0, 0, &r.gnorm, &h)) return -1;
    r.has |= h ? HAS_GNORM : 0;
    if (row_num(l, line, "a step", row, "joules", 0, 0, &r.joules, &h)) return -1;
    r.has |= h ? HAS_JOULES : 0;
    if (r.paused > r.seconds)
        return nl_err("%s:%d: \"paused_seconds\" %g is more than the step's \"seconds\" %g", l->path, line, r.paused,
                      r.seconds);
    if (l->ns && r.step <= l->s[l->ns - 1].step)
        return nl_err("%s:%d: step %lld after step %lld: steps must increase (a log holds one run; a new run without "
                      "--resume starts "
                      "its log anew)",
                      l->path, line, (long long)r.step, (long long)l->s[l->ns - 1].step);
    r.t0 = l->clock;
    l->clock += r.seconds;
    l->s[l->ns++] = r;
    return 0;
}

static int read_eval(run_log *l, int line, const nl_json *ev) {
    if (!nl_json_is_object(ev))
        return nl_err("%s:%d:%zu: \"eval\" is %s, expected an object", l->path, line, ev->offset + 1, kind_of(ev));
    if (grow((void **)&l->e, &l->cap_e, l->ne, sizeof *l->e)) return -1;
    eval_row r = {0};
    r.accuracy = NAN;
    if (row_int(l, line, "a validation", ev, "step", 1, 0, &r.step) ||
        row_num(l, line, "a validation", ev, "loss", 1, -INFINITY, &r.loss, NULL) ||
        row_int(l, line, "a validation", ev, "examples", 0, 0, &r.examples) ||
        row_int(l, line, "a validation", ev, "tokens", 0, 0, &r.tokens) ||
        row_num(l, line, "a validation", ev, "seconds", 0, 0, &r.seconds, NULL))
        return -1;
    const nl_json *a = nl_json_get(ev, "accuracy");
    if (a && !nl_json_is_null(a)) {
        if (!nl_json_is_number(a) || a->u.num.d < 0 || a->u.num.d > 1)
            return nl_err("%s:%d:%zu: \"accuracy\" is %s, expected a fraction in [0, 1] or null", l->path, line,
                          a->offset + 1, nl_json_is_number(a) ? "out of range" : kind_of(a));
        r.accuracy = a->u.num.d;
    }
    r.t0 = l->clock;
    l->clock += r.seconds;
    l->e[l->ne++] = r;
    return 0;
}

static void note_other(run_log *l, const nl_json *row) {
    l->n_other++;
    const char *k = nl_json_len(row) ? row->u.obj.members[0].key : "{}";
    size_t n = strlen(l->other_kinds);
    if (n + strlen(k) + 8 >= sizeof l->other_kinds) return;
    /* each kind once */
    char quoted[80];
    snprintf(quoted, sizeof quoted, "\"%.60s\"", k);
    if (strstr(l->other_kinds, quoted)) return;
    snprintf(l->other_kinds + n, sizeof l->other_kinds - n, "%s%s", n ? ", " : "", quoted);
}

static int read_log(run_log *l, const char *path) {
    memset(l, 0, sizeof *l);
    l->path = path;
    size_t len;
    char *buf = nl_read_file(path, &len);
    if (!buf) return -1;
    int rc = 0, line = 1;
    for (const char *p = buf, *end = buf + len; p < end && rc == 0; line++) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        size_t n = eol ? (size_t)(eol - p) : (size_t)(end - p);
        const char *next = eol ? eol + 1 : end;
        size_t k = 0;
        while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
        if (k == n) {
            p = next;
            continue;
        } /* a blank line */
        nl_json_error je;
        nl_json *row = nl_json_parse(p, n, &je);
        if (!row) {
            if (!eol) {
                l->tail_line = line;
                break;
            } /* written by a run killed at that moment */
            rc = nl_err("%s:%d:%zu: %s", path, line, je.offset + 1, je.msg);
            break;
        }
        if (!nl_json_is_object(row))
            rc = nl_err("%s:%d: %s, expected a JSON object (a step or an \"eval\" row)", path, line, kind_of(row));
        else if (nl_json_get(row, "step")) rc = read_step(l, line, row);
        else if (nl_json_get(row, "eval")) rc = read_eval(l, line, nl_json_get(row, "eval"));
        else note_other(l, row);
        nl_json_free(row);
        p = next;
    }
    free(buf);
    if (rc == 0 && l->ns == 0)
        rc = nl_err("%s: no training step in the log%s: nothing to draw", path, len ? "" : " (it is empty)");
    if (rc) log_free(l);
    return rc;
}

/* ---- the output text ---- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 65536;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) NL_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        sb_put(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_put(b, big, (size_t)n);
    free(big);
}

/* Text for HTML and SVG (both XML-safe): & < > " ' escaped. */
static void sb_esc(sbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *r = NULL;
        switch (s[i]) {
        case '&': r = "&amp;"; break;
        case '<': r = "&lt;"; break;
        case '>': r = "&gt;"; break;
        case '"': r = "&quot;"; break;
        case '\'': r = "&#39;"; break;
        case 0: r = "\xEF\xBF\xBD"; break; /* NUL is no XML character: U+FFFD */
        default:
            if ((unsigned char)s[i] < 0x20 && s[i] != '\t' && s[i] != '\n') r = " ";
        }
        if (r) sb_put(b, r, strlen(r));
        else sb_put(b, s + i, 1);
    }
}
static void sb_escs(sbuf *b, const char *s) { sb_esc(b, s, strlen(s)); }

/* A string literal, its length counted by the compiler. */
#define SB(b, lit) sb_put((b), (lit), sizeof(lit) - 1)

/* ---- charts: inline SVG ---- */

enum { S_LINE, S_POINTS, S_AREA };
enum { CH_W = 880, CH_H = 270, CH_L = 70, CH_R = 20, CH_T = 30, CH_B = 42, MAX_PTS = 1200 };

typedef struct {
    const char *id, *label, *color;
    int kind;
    const double *x, *y, *y0; /* y0: an area's lower edge (NULL: 0) */
    const char *const *tip;   /* points: a tooltip each (NULL: none) */
    int n;
} series;

typedef struct {
    double x0, x1;
    const char *cls; /* "pause" or "eval" */
    unsigned kind;   /* a pause's NL_PAUSE_* (0: not said) */
    char tip[96];
} band;

typedef struct {
    const char *id, *title, *xlabel, *ylabel;
    series s[4];
    int ns;
    const band *b;
    int nb;
    int y_zero;    /* the y axis starts at 0 */
    int y_percent; /* y in [0, 100] */
    int y_log;     /* a log10 y axis (every y > 0: the caller checks) */
    int x_fixed;   /* x spans [x_lo, x_hi] (the step charts share one span), not the data's own */
    double x_lo, x_hi;
    const double *marks;          /* resumes: a dashed vertical line at each x */
    const char *const *mark_tips; /* what each resume was (the command, its changes) */
    int nmarks;
} chart;

typedef struct {
    double lo, hi, step;
} axis;

static axis nice_axis(double lo, double hi, int zero) {
    if (zero && lo > 0) lo = 0;
    if (!(hi > lo)) {
        double d = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1.0;
        lo -= d;
        hi += d;
    }
    double raw = (hi - lo) / 5, mag = pow(10, floor(log10(raw))), f = raw / mag;
    double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
    axis a = {floor(lo / step) * step, ceil(hi / step) * step, step};
    if (zero && a.lo < 0 && lo >= 0) a.lo = 0;
    return a;
}

/* A tick label: plain decimals, as many as the tick step needs (steps are 1, 2 or 5 x 10^k);
 * exponent form only for very large or small numbers. */
static void tick_label(char *buf, size_t cap, double v, double step) {
    if (fabs(v) < step * 1e-9) v = 0;
    double k = floor(log10(step) + 1e-9);
    if (fabs(v) >= 1e7 || step < 1e-6) snprintf(buf, cap, "%.3g", v);
    else snprintf(buf, cap, "%.*f", k < 0 ? (int)-k : 0, v);
}

typedef struct {
    axis ax, ay; /* ay in log10 units when ylog */
    int ylog;
} frame;

static double px(const frame *f, double x) {
    return CH_L + (x - f->ax.lo) / (f->ax.hi - f->ax.lo) * (CH_W - CH_L - CH_R);
}
static double py(const frame *f, double y) {
    if (f->ylog) y = log10(y);
    return CH_T + (f->ay.hi - y) / (f->ay.hi - f->ay.lo) * (CH_H - CH_T - CH_B);
}

/* A log axis's ticks over [10^lo, 10^hi]: 1, 2 and 5 x 10^k, or every m x 10^k (m = 1..9) where
 * that gives fewer than 3; *n of at most cap. */
static int log_ticks(double lo, double hi, double *t, int cap) {
    for (int dense = 0; dense < 2; dense++) {
        int n = 0;
        for (int k = (int)floor(lo) - 1; k <= (int)ceil(hi) && n < cap; k++)
            for (int m = 1; m <= 9 && n < cap; m++) {
                if (!dense && m != 1 && m != 2 && m != 5) continue;
                double v = m * pow(10, k), lv = log10(v);
                if (lv >= lo - 1e-9 && lv <= hi + 1e-9) t[n++] = v;
            }
        if (n >= 3 || dense) return n;
    }
    return 0;
}

/* The points a line or area draws: every point, or the means of MAX_PTS bins of them. */
static int bin_of(int n, int k, int m, int *i0, int *i1) {
    *i0 = (int)((int64_t)k * n / m);
    *i1 = (int)((int64_t)(k + 1) * n / m);
    return *i1 > *i0;
}
static void series_point(const series *s, int k, int m, double *x, double *y, double *y0) {
    int i0, i1;
    if (m == s->n) {
        i0 = k;
        i1 = k + 1;
    } else bin_of(s->n, k, m, &i0, &i1);
    double sx = 0, sy = 0, s0 = 0;
    for (int i = i0; i < i1; i++) {
        sx += s->x[i];
        sy += s->y[i];
        s0 += s->y0 ? s->y0[i] : 0;
    }
    *x = sx / (i1 - i0);
    *y = sy / (i1 - i0);
    *y0 = s0 / (i1 - i0);
}

static void draw_series(sbuf *b, const frame *f, const series *s) {
    int m = s->kind != S_POINTS && s->n > MAX_PTS ? MAX_PTS : s->n;
    if (s->kind == S_POINTS) {
        sb_printf(b, "<g class=\"series points\" data-series=\"%s\" fill=\"%s\">", s->id, s->color);
        for (int i = 0; i < s->n; i++) {
            sb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\">", px(f, s->x[i]), py(f, s->y[i]));
            if (s->tip && s->tip[i]) {
                SB(b, "<title>");
                sb_escs(b, s->tip[i]);
                SB(b, "</title>");
            }
            SB(b, "</circle>");
        }
        SB(b, "</g>\n");
        return;
    }
    sb_printf(b, "<path class=\"series %s\" data-series=\"%s\" data-points=\"%d\" ",
              s->kind == S_AREA ? "area" : "line", s->id, s->n);
    if (s->kind == S_AREA) sb_printf(b, "fill=\"%s\" fill-opacity=\"0.75\" stroke=\"none\" d=\"", s->color);
    else sb_printf(b, "fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" stroke-linejoin=\"round\" d=\"", s->color);
    double x, y, y0;
    for (int k = 0; k < m; k++) {
        series_point(s, k, m, &x, &y, &y0);
        sb_printf(b, "%c%.1f %.1f", k ? 'L' : 'M', px(f, x), py(f, y));
    }
    if (s->kind == S_AREA) {
        for (int k = m - 1; k >= 0; k--) {
            series_point(s, k, m, &x, &y, &y0);
            sb_printf(b, "L%.1f %.1f", px(f, x), py(f, y0));
        }
        SB(b, "Z");
    }
    SB(b, "\"/>\n");
}

/* One chart as inline SVG. Long (~135 lines): the frame (the data's span, a fixed step span or a
 * log axis), then each layer in drawing order (bands, grid, ticks, series, resume markers, the
 * legend), each a few lines writing the same buffer with the same frame. */
static void draw_chart(sbuf *b, const chart *c, const char *caption) {
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (int i = 0; i < c->ns; i++)
        for (int j = 0; j < c->s[i].n; j++) {
            const series *s = &c->s[i];
            xlo = fmin(xlo, s->x[j]);
            xhi = fmax(xhi, s->x[j]);
            ylo = fmin(ylo, fmin(s->y[j], s->y0 ? s->y0[j] : s->kind == S_AREA ? 0 : s->y[j]));
            yhi = fmax(yhi, s->y[j]);
        }
    for (int i = 0; i < c->nb; i++) {
        xlo = fmin(xlo, c->b[i].x0);
        xhi = fmax(xhi, c->b[i].x1);
    }
    for (int i = 0; i < c->nmarks; i++) {
        xlo = fmin(xlo, c->marks[i]);
        xhi = fmax(xhi, c->marks[i]);
    }
    if (c->x_fixed) {
        xlo = c->x_lo;
        xhi = c->x_hi;
    }
    if (c->y_percent) {
        ylo = 0;
        yhi = 100;
    }
    if (!(xlo <= xhi)) xlo = xhi = 0;
    if (!(ylo <= yhi)) ylo = yhi = 0;
    frame f = {nice_axis(xlo, xhi, 0), nice_axis(ylo, yhi, c->y_zero || c->y_percent), 0};
    if (xhi > xlo) {
        f.ax.lo = xlo;
        f.ax.hi = xhi;
    } /* x: the data's own span; ticks at the nice steps inside it */
    double lt[40];
    int nlt = 0;
    if (c->y_log && ylo > 0 && yhi >= ylo) {
        /* log10 units, a twentieth of the span (or of a decade) as margin */
        double lo = log10(ylo), hi = log10(yhi), pad = fmax(hi - lo, 0.3) * 0.05;
        f.ylog = 1;
        f.ay = (axis){lo - pad, hi + pad, 1};
        nlt = log_ticks(f.ay.lo, f.ay.hi, lt, 40);
        if (nlt < 3) { /* a narrow span (5.3 to 6.3): out to the ticks around it (5 to 7) */
            double vlo = pow(10, f.ay.lo), vhi = pow(10, f.ay.hi), klo = pow(10, floor(log10(vlo))),
                   khi = pow(10, floor(log10(vhi)));
            f.ay.lo = log10(floor(vlo / klo) * klo);
            f.ay.hi = log10(ceil(vhi / khi) * khi);
            nlt = log_ticks(f.ay.lo, f.ay.hi, lt, 40);
        }
    }
    sb_printf(b,
              "<figure id=\"%s\">\n<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" "
              "width=\"%d\" height=\"%d\" "
              "role=\"img\" aria-label=\"",
              c->id, CH_W, CH_H, CH_W, CH_H);
    sb_escs(b, c->title);
    SB(b, "\">\n");
    int x0 = CH_L, x1 = CH_W - CH_R, y0 = CH_T, y1 = CH_H - CH_B;
    sb_printf(b, "<rect class=\"plot\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>\n", x0, y0, x1 - x0, y1 - y0);
    for (int i = 0; i < c->nb; i++) {
        const band *bd = &c->b[i];
        double a = px(&f, bd->x0), w = px(&f, bd->x1) - a;
        sb_printf(b, "<rect class=\"band %s\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\"><title>", bd->cls, a, y0,
                  w < 1 ? 1.0 : w, y1 - y0);
        sb_escs(b, bd->tip);
        SB(b, "</title></rect>\n");
    }
    char lab[48];
    SB(b, "<g class=\"grid\">");
    if (f.ylog)
        for (int i = 0; i < nlt; i++)
            sb_printf(b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\"/>", x0, x1, py(&f, lt[i]), py(&f, lt[i]));
    else
        for (double v = f.ay.lo; v <= f.ay.hi + f.ay.step * 1e-6; v += f.ay.step)
            sb_printf(b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\"/>", x0, x1, py(&f, v), py(&f, v));
    sb_printf(b, "</g>\n<g class=\"ticks\"%s>", f.ylog ? " data-scale=\"log\"" : "");
    if (f.ylog)
        for (int i = 0; i < nlt; i++) {
            snprintf(lab, sizeof lab, "%g", lt[i]);
            sb_printf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>", x0 - 6, py(&f, lt[i]) + 4, lab);
        }
    else
        for (double v = f.ay.lo; v <= f.ay.hi + f.ay.step * 1e-6; v += f.ay.step) {
            tick_label(lab, sizeof lab, v, f.ay.step);
            sb_printf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>", x0 - 6, py(&f, v) + 4, lab);
        }
    double t = ceil(f.ax.lo / f.ax.step - 1e-9) * f.ax.step;
    for (; t <= f.ax.hi + f.ax.step * 1e-6; t += f.ax.step) {
        tick_label(lab, sizeof lab, t, f.ax.step);
        sb_printf(b,
                  "<line class=\"tick\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/><text x=\"%.1f\" y=\"%d\" "
                  "text-anchor=\"middle\">%s</text>",
                  px(&f, t), px(&f, t), y1, y1 + 4, px(&f, t), y1 + 17, lab);
    }
    SB(b, "</g>\n");
    sb_printf(b, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>\n", x0, y0, x1 - x0, y1 - y0);
    for (int i = 0; i < c->ns; i++)
        if (c->s[i].kind == S_AREA) draw_series(b, &f, &c->s[i]);
    for (int i = 0; i < c->ns; i++)
        if (c->s[i].kind != S_AREA) draw_series(b, &f, &c->s[i]);
    /* the resumes: a dashed line at the step (or time) each started from, labelled */
    for (int i = 0; i < c->nmarks; i++) {
        double mx = px(&f, c->marks[i]);
        sb_printf(b,
                  "<g class=\"resume\" data-x=\"%.6g\"><line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/><text "
                  "x=\"%.1f\" y=\"%d\">resume</text><title>",
                  c->marks[i], mx, mx, y0, y1, mx + 3, y0 + 11);
        sb_escs(b, c->mark_tips && c->mark_tips[i] ? c->mark_tips[i] : "resumed");
        SB(b, "</title></g>\n");
    }
    /* axis titles and the legend */
    sb_printf(b, "<text class=\"axis\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (x0 + x1) / 2, CH_H - 6);
    sb_escs(b, c->xlabel);
    sb_printf(b, "</text>\n<text class=\"axis\" transform=\"translate(14 %d) rotate(-90)\" text-anchor=\"middle\">",
              (y0 + y1) / 2);
    sb_escs(b, c->ylabel);
    SB(b, "</text>\n<g class=\"legend\">");
    double lx = x0;
    for (int i = 0; i < c->ns; i++) {
        if (!c->s[i].label) continue;
        sb_printf(b, "<rect x=\"%.0f\" y=\"9\" width=\"14\" height=\"10\" fill=\"%s\"/><text x=\"%.0f\" y=\"18\">", lx,
                  c->s[i].color, lx + 19);
        sb_escs(b, c->s[i].label);
        SB(b, "</text>");
        lx += 32 + 6.3 * (double)strlen(c->s[i].label);
    }
    /* the pauses' kinds in the legend when every pause says it (older logs do not) */
    unsigned kinds = 0;
    int unsaid = 0;
    for (int i = 0; i < c->nb; i++)
        if (!strcmp(c->b[i].cls, "pause")) {
            kinds |= c->b[i].kind;
            unsaid |= !c->b[i].kind;
        }
    const char *pause_what = unsaid || !kinds            ? "paused (thermal/battery)"
                             : kinds == NL_PAUSE_THERMAL ? "paused (thermal)"
                             : kinds == NL_PAUSE_BATTERY ? "paused (battery)"
                                                         : "paused (thermal, battery)";
    int seen_pause = 0, seen_eval = 0;
    for (int i = 0; i < c->nb; i++) {
        int pause = !strcmp(c->b[i].cls, "pause");
        if (pause ? seen_pause : seen_eval) continue;
        if (pause) seen_pause = 1;
        else seen_eval = 1;
        const char *what = pause ? pause_what : "validation";
        sb_printf(b,
                  "<rect class=\"band %s\" x=\"%.0f\" y=\"9\" width=\"14\" height=\"10\"/><text x=\"%.0f\" "
                  "y=\"18\">%s</text>",
                  c->b[i].cls, lx, lx + 19, what);
        lx += 32 + 6.3 * (double)strlen(what);
    }
    if (c->nmarks) {
        sb_printf(b,
                  "<line class=\"resume-key\" x1=\"%.0f\" x2=\"%.0f\" y1=\"9\" y2=\"19\"/><text x=\"%.0f\" "
                  "y=\"18\">resumed (--resume)</text>",
                  lx + 7, lx + 7, lx + 19);
        lx += 32 + 6.3 * 18;
    }
    SB(b, "</g>\n</svg>\n<figcaption>");
    sb_escs(b, c->title);
    if (f.ylog) SB(b, " (log scale)");
    if (caption && *caption) {
        SB(b, ". ");
        sb_escs(b, caption);
    }
    SB(b, "</figcaption>\n</figure>\n");
}

/* ---- the page ---- */

static const char css[] = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica "
                          "Neue',Arial,sans-serif;color:#1d2733;background:#fff;"
                          "margin:24px auto;max-width:920px;padding:0 16px;line-height:1.4}\n"
                          "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px "
                          "solid #d8dee6;padding-bottom:4px}\n"
                          "p.sub{color:#5a6776;margin:0 0 12px}p.note{color:#5a6776;font-size:14px}\n"
                          "figure{margin:10px 0 18px}figcaption{font-size:13px;color:#5a6776;margin-top:2px}\n"
                          "svg.chart{display:block;max-width:100%;height:auto;font-size:11px;fill:#34404d}\n"
                          "svg .plot{fill:#fbfcfd}svg .frame{fill:none;stroke:#aab4c0}svg .grid "
                          "line{stroke:#e6eaef}svg .tick{stroke:#aab4c0}\n"
                          "svg .resume line,svg .resume-key{stroke:#b8322a;stroke-width:1.5;stroke-dasharray:5 3}svg "
                          ".resume text{fill:#b8322a;font-size:10px}\n"
                          "details summary{font-size:13px;color:#5a6776;cursor:pointer}\n"
                          "svg .axis{font-size:12px;fill:#34404d}svg .band.pause{fill:#f4a261;fill-opacity:.35}svg "
                          ".band.eval{fill:#8fbf6a;fill-opacity:.35}\n"
                          "table{border-collapse:collapse;font-size:14px;margin:6px 0 "
                          "12px}td,th{text-align:left;padding:3px 14px 3px 0;vertical-align:top}\n"
                          "th{color:#5a6776;font-weight:600;white-space:nowrap}td{font-family:ui-monospace,SFMono-"
                          "Regular,Menlo,Consolas,monospace;"
                          "font-size:13px;word-break:break-all}\n"
                          ".facts td{font-family:inherit;font-size:14px;word-break:normal}\n";

static void fact(sbuf *b, const char *key, const char *fmt, ...) NL_PRINTF(3, 4);
static void fact(sbuf *b, const char *key, const char *fmt, ...) {
    char v[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    SB(b, "<tr><th>");
    sb_escs(b, key);
    SB(b, "</th><td>");
    sb_escs(b, v);
    SB(b, "</td></tr>\n");
}

static void fmt_dur(char *buf, size_t cap, double s) {
    if (s < 120) snprintf(buf, cap, "%.1f s", s);
    else if (s < 7200) snprintf(buf, cap, "%.1f min", s / 60);
    else snprintf(buf, cap, "%.2f h", s / 3600);
}

/* The run.json settings as table rows (every value a string as the trainer writes them;
 * numbers and booleans shown as they are, anything else by its JSON type). */
static int settings_rows(sbuf *b, const char *path) {
    size_t len;
    char *buf = nl_read_file(path, &len);
    if (!buf) return -1;
    nl_json_error je;
    nl_json *j = nl_json_parse(buf, len, &je);
    if (!j) {
        int line, col;
        nl_json_linecol(buf, len, je.offset, &line, &col);
        nl_err("%s:%d:%d: %s", path, line, col, je.msg);
        free(buf);
        return -1;
    }
    int rc = 0;
    if (!nl_json_is_object(j)) rc = nl_err("%s: is %s, expected the JSON object a run.json holds", path, kind_of(j));
    for (size_t i = 0; rc == 0 && i < nl_json_len(j); i++) {
        const nl_json_member *m = &j->u.obj.members[i];
        /* the model and the data: the file's path beside its content hash (one row) */
        const int is_file = !strcmp(m->key, "model") || !strcmp(m->key, "data");
        char pk[16];
        snprintf(pk, sizeof pk, "%.5s_path", m->key);
        const nl_json *path = is_file ? nl_json_get(j, pk) : NULL;
        if ((!strcmp(m->key, "model_path") && nl_json_get(j, "model")) ||
            (!strcmp(m->key, "data_path") && nl_json_get(j, "data")))
            continue; /* shown with the hash */
        SB(b, "<tr><th>");
        sb_esc(b, m->key, m->key_len);
        SB(b, "</th><td>");
        if (nl_json_is_string(path) && nl_json_is_string(&m->value)) {
            sb_esc(b, path->u.str.s, path->u.str.len);
            SB(b, " (content hash ");
            sb_esc(b, m->value.u.str.s, m->value.u.str.len);
            SB(b, ")");
        } else if (nl_json_is_string(&m->value)) sb_esc(b, m->value.u.str.s, m->value.u.str.len);
        else if (nl_json_is_number(&m->value)) sb_printf(b, "%.17g", m->value.u.num.d);
        else sb_escs(b, nl_json_type_name(m->value.type));
        SB(b, "</td></tr>\n");
    }
    nl_json_free(j);
    free(buf);
    return rc;
}

/* ---- the run's history: DIR/runs.jsonl beside run.json (train/rundesc.h) ---- */

typedef struct {
    int64_t step, steps; /* the step it started from, the run's total then */
    int resume;
    char *command, *changes; /* NULL: not recorded */
} run_hist;

typedef struct {
    run_hist *r;
    int n, cap;
    char *path;
} history;

static void hist_free(history *h) {
    for (int i = 0; i < h->n; i++) {
        free(h->r[i].command);
        free(h->r[i].changes);
    }
    free(h->r);
    free(h->path);
    memset(h, 0, sizeof *h);
}

static char *json_strdup(const nl_json *v) {
    if (!nl_json_is_string(v)) return NULL;
    char *c = malloc(v->u.str.len + 1);
    if (c) {
        memcpy(c, v->u.str.s, v->u.str.len);
        c[v->u.str.len] = 0;
    }
    return c;
}

/* The history beside run_path (none when there is no runs.jsonl: a run from before it, or a
 * run.json copied elsewhere); a line that is no history row is an error naming the file and line. */
static int read_history(history *h, const char *run_path) {
    memset(h, 0, sizeof *h);
    if (!run_path) return 0;
    const char *slash = strrchr(run_path, '/');
    size_t dl = slash ? (size_t)(slash - run_path) : 1;
    if (!(h->path = nl_malloc(dl + 12))) return -1;
    snprintf(h->path, dl + 12, "%.*s/runs.jsonl", (int)dl, slash ? run_path : ".");
    struct stat st;
    if (stat(h->path, &st) != 0) return 0;
    size_t len;
    char *buf = nl_read_file(h->path, &len);
    if (!buf) {
        hist_free(h);
        return -1;
    }
    int rc = 0, line = 1;
    for (const char *p = buf, *end = buf + len; p < end && !rc; line++) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) break; /* cut by a crash: left out */
        nl_json_error je;
        nl_json *j = nl_json_parse(p, (size_t)(eol - p), &je);
        int64_t st_ = 0, tot = 0;
        const nl_json *rs = j ? nl_json_get(j, "resume") : NULL;
        if (!j) rc = nl_err("%s:%d:%zu: %s", h->path, line, je.offset + 1, je.msg);
        else if (!nl_json_is_object(j) || nl_json_int64(nl_json_get(j, "step"), &st_) || st_ < 0 || !rs ||
                 (rs->type != NL_JSON_TRUE && rs->type != NL_JSON_FALSE))
            rc = nl_err("%s:%d: expected a run's row {\"step\": N, \"resume\": true|false, ...}", h->path, line);
        else if (grow((void **)&h->r, &h->cap, h->n, sizeof *h->r)) rc = -1;
        else {
            nl_json_int64(nl_json_get(j, "steps"), &tot);
            h->r[h->n++] = (run_hist){st_, tot, rs->type == NL_JSON_TRUE, json_strdup(nl_json_get(j, "command")),
                                      json_strdup(nl_json_get(j, "changes"))};
        }
        nl_json_free(j);
        p = eol + 1;
    }
    free(buf);
    if (rc) hist_free(h);
    return rc;
}

static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* The page. Long (~300 lines): the HTML is written top to bottom in the order it reads (the
 * settings, the charts, the tables), each part a few lines of the same buffer and run log. */
static int render(sbuf *b, const run_log *l, const nl_report_opts *o, const char *run_path, const history *h) {
    const int ns = l->ns, ne = l->ne;
    const step_row *s = l->s;
    const eval_row *e = l->e;
    /* what the rows hold */
    unsigned any = 0;
    double tokens = 0, secs = 0, paused = 0, svc = 0, joules = 0, eval_s = 0;
    int n_paused = 0, n_acc = 0, n_thermal = 0, n_battery = 0;
    for (int i = 0; i < ns; i++) {
        any |= s[i].has;
        tokens += (double)s[i].tokens;
        secs += s[i].seconds;
        paused += s[i].paused;
        svc += s[i].service;
        joules += s[i].joules;
        n_paused += s[i].paused > 0;
        n_thermal += s[i].paused > 0 && (s[i].pause_kind & NL_PAUSE_THERMAL);
        n_battery += s[i].paused > 0 && (s[i].pause_kind & NL_PAUSE_BATTERY);
    }
    int best = -1, best_acc = -1;
    for (int i = 0; i < ne; i++) {
        eval_s += e[i].seconds;
        if (best < 0 || e[i].loss < e[best].loss) best = i;
        if (!isnan(e[i].accuracy)) {
            n_acc++;
            if (best_acc < 0 || e[i].accuracy > e[best_acc].accuracy) best_acc = i;
        }
    }
    double active = secs - paused;
    /* the arrays the charts draw */
    size_t nb = (size_t)(ns > ne ? ns : ne) + 1;
    double *xs = malloc(nb * sizeof(double) * 11);
    band *bands = calloc((size_t)(n_paused + ne) + 1, sizeof *bands);
    const char **tips = calloc((size_t)ne + 1, sizeof *tips);
    char *tipbuf = malloc(((size_t)ne + 1) * 2 * 96);
    /* the resumes: the step each started from, its time in the run, what it was */
    enum { MTIP = 1200 };
    double *mk = malloc(((size_t)h->n + 1) * 2 * sizeof(double));
    const char **mtips = calloc((size_t)h->n + 1, sizeof *mtips);
    char *mtipbuf = malloc(((size_t)h->n + 1) * MTIP);
    if (!xs || !bands || !tips || !tipbuf || !mk || !mtips || !mtipbuf) {
        free(xs);
        free(bands);
        free(tips);
        free(tipbuf);
        free(mk);
        free(mtips);
        free(mtipbuf);
        return nl_err("out of memory drawing the report");
    }
    double *step_x = xs, *loss = xs + nb, *mean = xs + 2 * nb, *lr = xs + 3 * nb, *gn = xs + 4 * nb,
           *t_end = xs + 5 * nb, *tps = xs + 6 * nb, *svc_y = xs + 7 * nb, *cpu_y = xs + 8 * nb, *ex = xs + 9 * nb,
           *ey = xs + 10 * nb;
    double clock = l->clock;
    const char *unit = clock < 180 ? "s" : clock < 3 * 3600 ? "min" : "h";
    double per = clock < 180 ? 1 : clock < 3 * 3600 ? 60 : 3600;
    int nm = 0;
    double *mk_t = mk + h->n + 1;
    for (int i = 0; i < h->n; i++) {
        if (!h->r[i].resume) continue;
        int j = 0;
        while (j < ns && s[j].step <= h->r[i].step) j++;
        mk[nm] = (double)h->r[i].step;
        mk_t[nm] = (j < ns ? s[j].t0 : clock) / per;
        char *t = mtipbuf + (size_t)nm * MTIP;
        snprintf(t, MTIP, "resumed at step %lld (to step %lld): %s%s%s", (long long)h->r[i].step,
                 (long long)h->r[i].steps,
                 h->r[i].command ? h->r[i].command : "the command is not recorded (a library call)",
                 h->r[i].changes && h->r[i].changes[0] ? "; changed " : "", h->r[i].changes ? h->r[i].changes : "");
        mtips[nm++] = t;
    }
    /* the step charts share one x span: the steps, the evaluations and the resumes */
    double sxlo = (double)s[0].step, sxhi = (double)s[ns - 1].step;
    for (int i = 0; i < ne; i++) {
        sxlo = fmin(sxlo, (double)e[i].step);
        sxhi = fmax(sxhi, (double)e[i].step);
    }
    for (int i = 0; i < nm; i++) {
        sxlo = fmin(sxlo, mk[i]);
        sxhi = fmax(sxhi, mk[i]);
    }
#define STEP_AXIS .x_fixed = 1, .x_lo = sxlo, .x_hi = sxhi, .marks = mk, .mark_tips = mtips, .nmarks = nm
    int window = ns >= 40 ? (ns / 20 < 200 ? ns / 20 : 200) : 0, nband = 0;
    double run_sum = 0;
    for (int i = 0; i < ns; i++) {
        step_x[i] = (double)s[i].step;
        loss[i] = s[i].loss;
        lr[i] = s[i].lr;
        gn[i] = s[i].gnorm;
        t_end[i] = (s[i].t0 + s[i].seconds) / per;
        double act = s[i].seconds - s[i].paused;
        tps[i] = act > 0 ? (double)s[i].tokens / act : 0;
        svc_y[i] = fmin(s[i].service, act);
        cpu_y[i] = act; /* service + the rest of the step on the CPU */
        run_sum += s[i].loss;
        if (i >= 2 * window + 1) run_sum -= s[i - 2 * window - 1].loss;
        if (window && i >= 2 * window) mean[i - window] = run_sum / (2 * window + 1);
        if (s[i].paused > 0) {
            band *bd = &bands[nband++];
            bd->x0 = s[i].t0 / per;
            bd->x1 = (s[i].t0 + s[i].paused) / per;
            bd->cls = "pause";
            bd->kind = s[i].pause_kind;
            const char *kn = nl_pause_kind_name(s[i].pause_kind);
            snprintf(bd->tip, sizeof bd->tip, "paused %.1f s in step %lld%s%s%s", s[i].paused, (long long)s[i].step,
                     kn ? " (" : "", kn ? kn : "", kn ? ")" : "");
        }
    }
    for (int i = 0; i < ne; i++) {
        ex[i] = (double)e[i].step;
        ey[i] = e[i].loss;
        char *t = tipbuf + (size_t)i * 2 * 96;
        snprintf(t, 96, "step %lld: validation loss %.4f (%lld examples)", (long long)e[i].step, e[i].loss,
                 (long long)e[i].examples);
        tips[i] = t;
        if (e[i].seconds > 0) {
            band *bd = &bands[nband++];
            bd->x0 = e[i].t0 / per;
            bd->x1 = (e[i].t0 + e[i].seconds) / per;
            bd->cls = "eval";
            snprintf(bd->tip, sizeof bd->tip, "validation at step %lld: %.1f s", (long long)e[i].step, e[i].seconds);
        }
    }

    const char *title = o->title ? o->title : "nightlora training report";
    char d1[32], d2[32], d3[32];
    SB(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" "
          "content=\"width=device-width, initial-scale=1\">\n<title>");
    sb_escs(b, title);
    sb_printf(b, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>", css);
    sb_escs(b, title);
    fmt_dur(d1, sizeof d1, clock);
    sb_printf(b,
              "</h1>\n<p class=\"sub\">steps %lld to %lld, %.0f tokens, %s on the clock (training, pauses and "
              "validation); loss %.4f &#8594; %.4f",
              (long long)s[0].step, (long long)s[ns - 1].step, tokens, d1, s[0].loss, s[ns - 1].loss);
    if (best >= 0) sb_printf(b, "; best validation loss %.4f at step %lld", e[best].loss, (long long)e[best].step);
    if (best_acc >= 0)
        sb_printf(b, ", best accuracy %.1f%% at step %lld", 100 * e[best_acc].accuracy, (long long)e[best_acc].step);
    SB(b, "</p>\n");
    if (l->tail_line)
        sb_printf(b,
                  "<p class=\"note\">Line %d of the log has no newline and is no JSON (a run stopped while writing "
                  "it): left out.</p>\n",
                  l->tail_line);

    /* 1. loss */
    SB(b, "<h2>Loss</h2>\n");
    chart c = {.id = "loss",
               .title = ne ? "Training and validation loss" : "Training loss",
               .xlabel = "step",
               .ylabel = "loss (nats per target token)",
               STEP_AXIS};
    c.s[c.ns++] =
        (series){"train-loss", "training loss", window ? "#9fc3e6" : "#2f6db5", S_LINE, step_x, loss, NULL, NULL, ns};
    if (window)
        c.s[c.ns++] = (series){"train-loss-mean",
                               "training loss, moving mean",
                               "#2f6db5",
                               S_LINE,
                               step_x + window,
                               mean + window,
                               NULL,
                               NULL,
                               ns - 2 * window};
    if (ne) {
        c.s[c.ns++] = (series){"val-loss-line", NULL, "#d9731a", S_LINE, ex, ey, NULL, NULL, ne};
        c.s[c.ns++] = (series){"val-loss", "validation loss", "#d9731a", S_POINTS, ex, ey, NULL, tips, ne};
    }
    char cap[400];
    if (window)
        snprintf(cap, sizeof cap, "The moving mean is over %d steps.%s", 2 * window + 1,
                 ne ? "" : " No validation rows in this log.");
    else
        snprintf(cap, sizeof cap, "%s",
                 ne ? "" : "No validation rows in this log (train with --val-data or --val-split).");
    /* a log axis (0.19 and 0.09 apart as 0.9 and 0.4 are), the linear one a click away */
    int all_pos = 1;
    for (int i = 0; i < ns; i++) all_pos &= s[i].loss > 0;
    for (int i = 0; i < ne; i++) all_pos &= e[i].loss > 0;
    c.y_log = all_pos;
    draw_chart(b, &c, cap);
    if (all_pos) {
        SB(b, "<details class=\"linear\"><summary>The loss on a linear axis</summary>\n");
        c.y_log = 0;
        c.id = "loss-linear";
        draw_chart(b, &c, cap);
        SB(b, "</details>\n");
    }

    /* 2. accuracy */
    if (n_acc) {
        double *ay = malloc(sizeof(double) * (size_t)n_acc * 2);
        const char **atips = calloc((size_t)n_acc, sizeof *atips);
        if (!ay || !atips) {
            free(ay);
            free(atips);
            b->oom = 1;
        } else {
            int k = 0;
            double *axx = ay + n_acc;
            for (int i = 0; i < ne; i++)
                if (!isnan(e[i].accuracy)) {
                    axx[k] = (double)e[i].step;
                    ay[k] = 100 * e[i].accuracy;
                    char *t = tipbuf + (size_t)i * 2 * 96 + 96;
                    snprintf(t, 96, "step %lld: accuracy %.1f%%", (long long)e[i].step, 100 * e[i].accuracy);
                    atips[k++] = t;
                }
            chart a = {.id = "accuracy",
                       .title = "Validation accuracy",
                       .xlabel = "step",
                       .ylabel = "accuracy (%)",
                       .y_percent = 1,
                       STEP_AXIS};
            a.s[a.ns++] = (series){"val-accuracy-line", NULL, "#3d8b37", S_LINE, axx, ay, NULL, NULL, n_acc};
            a.s[a.ns++] =
                (series){"val-accuracy", "validation accuracy", "#3d8b37", S_POINTS, axx, ay, NULL, atips, n_acc};
            SB(b, "<h2>Accuracy</h2>\n");
            draw_chart(b, &a, "The share of validation examples whose answer scores highest among their choices.");
        }
        free(ay);
        free(atips);
    } else {
        SB(b, "<h2>Accuracy</h2>\n<p class=\"note\">");
        sb_escs(b, ne ? "The validation rows carry no accuracy (their lines have no choices)."
                      : "No validation rows in this log: no accuracy.");
        SB(b, "</p>\n");
    }

    /* 3. learning rate, gradient norm */
    if (any & HAS_LR) {
        chart r = {
            .id = "lr", .title = "Learning rate", .xlabel = "step", .ylabel = "learning rate", .y_zero = 1, STEP_AXIS};
        r.s[r.ns++] = (series){"lr", "learning rate", "#7a4fb5", S_LINE, step_x, lr, NULL, NULL, ns};
        SB(b, "<h2>Learning rate</h2>\n");
        draw_chart(b, &r, "");
    }
    if (any & HAS_GNORM) {
        chart g = {.id = "grad-norm",
                   .title = "Gradient norm (before clipping)",
                   .xlabel = "step",
                   .ylabel = "gradient L2 norm",
                   .y_zero = 1,
                   STEP_AXIS};
        g.s[g.ns++] = (series){"grad-norm", "gradient norm", "#8a6d3b", S_LINE, step_x, gn, NULL, NULL, ns};
        SB(b, "<h2>Gradient norm</h2>\n");
        draw_chart(b, &g, "");
    }

    /* 4. throughput over the run's time, pauses and validations shaded */
    char tx[48];
    snprintf(tx, sizeof tx, "time in the run (%s)", unit);
    chart th = {.id = "throughput",
                .title = "Training tokens/s (paused time excluded) over the run",
                .xlabel = tx,
                .ylabel = "tokens/s",
                .y_zero = 1,
                .b = bands,
                .nb = nband,
                .marks = mk_t,
                .mark_tips = mtips,
                .nmarks = nm};
    th.s[th.ns++] = (series){"tokens-per-s", "tokens/s", "#1f8a8a", S_LINE, t_end, tps, NULL, NULL, ns};
    fmt_dur(d1, sizeof d1, paused);
    fmt_dur(d2, sizeof d2, eval_s);
    int k = snprintf(cap, sizeof cap, "Each step's tokens over its time not paused; %.0f tokens/s over the run. ",
                     active > 0 ? tokens / active : 0);
    if (n_paused)
        k +=
            snprintf(cap + k, sizeof cap - (size_t)k, "%s paused in %d step%s", d1, n_paused, n_paused == 1 ? "" : "s");
    else k += snprintf(cap + k, sizeof cap - (size_t)k, "No pause");
    snprintf(cap + k, sizeof cap - (size_t)k, "%s%s.", ne ? ", validation " : "", ne ? d2 : "");
    SB(b, "<h2>Throughput and pauses</h2>\n");
    draw_chart(b, &th, cap);

    /* 5. service vs CPU time per step */
    chart tm = {.id = "step-time",
                .title = "Seconds per step not paused: the projection service and the CPU",
                .xlabel = "step",
                .ylabel = "seconds",
                .y_zero = 1,
                STEP_AXIS};
    tm.s[tm.ns++] = (series){"cpu-s", "CPU (the rest of the step)", "#8da9c4", S_AREA, step_x, cpu_y, svc_y, NULL, ns};
    if (any & HAS_SVC)
        tm.s[tm.ns++] = (series){"service-s", "projection service", "#2f6db5", S_AREA, step_x, svc_y, NULL, NULL, ns};
    fmt_dur(d1, sizeof d1, svc);
    fmt_dur(d3, sizeof d3, active);
    snprintf(cap, sizeof cap,
             "Stacked: the service's busy time and the rest of the step (paused time is left out: the pauses are "
             "shaded above). Service %s of %s (%.0f%%)%s.",
             d1, d3, active > 0 ? 100 * svc / active : 0,
             ns > MAX_PTS ? "; each point the mean of consecutive steps" : "");
    SB(b, "<h2>Time per step</h2>\n");
    draw_chart(b, &tm, cap);

    /* 6. the settings */
    SB(b, "<h2>The run</h2>\n<table class=\"facts\">\n");
    fact(b, "steps logged", "%d (steps %lld to %lld)", ns, (long long)s[0].step, (long long)s[ns - 1].step);
    fact(b, "tokens", "%.0f", tokens);
    fmt_dur(d1, sizeof d1, secs);
    fmt_dur(d2, sizeof d2, paused);
    fmt_dur(d3, sizeof d3, active);
    char why[64] = "";
    if (n_thermal || n_battery) snprintf(why, sizeof why, " (thermal in %d, battery in %d)", n_thermal, n_battery);
    fact(b, "training time", "%s (%s paused in %d steps%s; %s not paused)", d1, d2, n_paused, why, d3);
    fact(b, "tokens/s", "%.0f (paused time excluded)", active > 0 ? tokens / active : 0);
    fact(b, "loss", "%.4f at step %lld, %.4f at step %lld", s[0].loss, (long long)s[0].step, s[ns - 1].loss,
         (long long)s[ns - 1].step);
    if (ne) {
        fmt_dur(d1, sizeof d1, eval_s);
        fact(b, "validation", "%d evaluations, %s; best loss %.4f at step %lld, last %.4f at step %lld", ne, d1,
             e[best].loss, (long long)e[best].step, e[ne - 1].loss, (long long)e[ne - 1].step);
        if (best_acc >= 0)
            fact(b, "accuracy", "best %.1f%% at step %lld, last %s", 100 * e[best_acc].accuracy,
                 (long long)e[best_acc].step,
                 isnan(e[ne - 1].accuracy) ? "none"
                                           : (snprintf(d2, sizeof d2, "%.1f%%", 100 * e[ne - 1].accuracy), d2));
    } else {
        fact(b, "validation", "none logged");
    }
    if (any & HAS_JOULES) fact(b, "energy", "%.1f J (%.4g J per token)", joules, tokens > 0 ? joules / tokens : 0);
    if (l->n_other) fact(b, "other rows", "%d, not drawn (%s)", l->n_other, l->other_kinds);
    SB(b, "</table>\n");
    /* every command of the run, from its history: the first and each resume, what it changed */
    if (h->n) {
        SB(b, "<h2>Commands</h2>\n<table class=\"commands\">\n");
        for (int i = 0; i < h->n; i++) {
            const run_hist *r = &h->r[i];
            if (r->resume)
                sb_printf(b, "<tr class=\"resume\"><th>resumed at step %lld (to step %lld)</th><td>",
                          (long long)r->step, (long long)r->steps);
            else sb_printf(b, "<tr><th>started (to step %lld)</th><td>", (long long)r->steps);
            sb_escs(b, r->command ? r->command : "(not recorded: a library call)");
            if (r->changes && r->changes[0]) {
                SB(b, "<br>changed: ");
                sb_escs(b, r->changes);
            }
            SB(b, "</td></tr>\n");
        }
        SB(b, "</table>\n");
    }
#undef STEP_AXIS
    SB(b, "<h2>Settings</h2>\n");
    int rc = 0;
    if (o->n_info || run_path) {
        SB(b, "<table class=\"settings\">\n");
        for (int i = 0; i < o->n_info; i++) {
            SB(b, "<tr><th>");
            sb_escs(b, o->info[i].key ? o->info[i].key : "");
            SB(b, "</th><td>");
            sb_escs(b, o->info[i].value ? o->info[i].value : "");
            SB(b, "</td></tr>\n");
        }
        if (run_path) rc = settings_rows(b, run_path);
        SB(b, "</table>\n");
    }
    if (!run_path)
        SB(b, "<p class=\"note\">No run.json given: the settings above are what the log carries (train with "
              "--checkpoint-dir for the run.json).</p>\n");
    SB(b, "<p class=\"note\">Written by nightlora from ");
    sb_escs(b, l->path);
    SB(b, ".</p>\n</body>\n</html>\n");
    free(xs);
    free(bands);
    free(tips);
    free(tipbuf);
    free(mk);
    free(mtips);
    free(mtipbuf);
    return rc;
}

int nl_report_write(const nl_report_opts *o, const char *out) {
    if (!o || !o->log || !out) return nl_err("report: a log and an output path are needed");
    /* run.json, or the checkpoint directory that holds it */
    char *run_path = NULL;
    if (o->run_json) {
        struct stat st;
        if (stat(o->run_json, &st) == 0 && S_ISDIR(st.st_mode)) {
            size_t n = strlen(o->run_json) + 10;
            if (!(run_path = nl_malloc(n))) return -1;
            snprintf(run_path, n, "%s/run.json", o->run_json);
        } else if (!(run_path = nl_strdup(o->run_json))) {
            return -1;
        }
    }
    size_t tn = strlen(out) + 5;
    char *tmp = nl_malloc(tn);
    if (!tmp) {
        free(run_path);
        return -1;
    }
    snprintf(tmp, tn, "%s.tmp", out);
    history h;
    if (read_history(&h, run_path)) {
        free(tmp);
        free(run_path);
        return -1;
    }
    const char *inputs[3] = {o->log, run_path, h.path};
    static const char *const what[3] = {"the log", "the run.json", "the run's history"};
    for (int i = 0; i < 3; i++) {
        if (!inputs[i]) continue;
        if (same_file(out, inputs[i]) || same_file(tmp, inputs[i])) {
            nl_err("%s: is %s %s (or its temp file %s is): the report never replaces what it reads", out, what[i],
                   inputs[i], tmp);
            free(tmp);
            free(run_path);
            hist_free(&h);
            return -1;
        }
    }
    free(tmp);
    run_log l;
    if (read_log(&l, o->log)) {
        free(run_path);
        hist_free(&h);
        return -1;
    }
    sbuf b = {0};
    int rc = render(&b, &l, o, run_path, &h);
    hist_free(&h);
    if (rc == 0 && b.oom) rc = nl_err("out of memory writing the report");
    if (rc == 0) { rc = nl_io_write_file(o->io, out, b.p, b.n); }
    free(b.p);
    log_free(&l);
    free(run_path);
    return rc;
}
