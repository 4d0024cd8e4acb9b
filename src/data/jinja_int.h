/* data/jinja_int.h: what the parts of the Jinja interpreter share (jinja_value.c, jinja_lex.c,
 * jinja_parse.c, jinja_eval.c, jinja_call.c): the value, token, tree and evaluator types and the
 * functions one part calls in another. Not a contract for other rooms: they use data/jinja.h. */
#ifndef NL_JINJA_INT_H
#define NL_JINJA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/jinja.h"
#include "util/util.h"

#define MAX_DEPTH 200 /* nesting of the parser and of macro calls */
#define MAX_OUTPUT (1u << 30)

/* ---- the rendering's budget ----
 * Every byte a rendering allocates (values, strings, lists, dicts, buffers) is charged to the
 * budget of the rendering in progress on this thread (nl_jb, NULL outside one) and released when
 * freed; every value made, node evaluated, loop iteration, call and 64 bytes written is an
 * operation. Past either limit every further charge fails (the callers' out-of-memory paths
 * unwind the rendering) and nl_jinja_render names the limit and the line. */
enum { NL_JB_MEM = 1, NL_JB_OPS, NL_JB_DEPTH };
typedef struct {
    size_t mem, mem_limit;
    uint64_t ops, ops_limit;
    int over; /* 0 or NL_JB_*: what ran out */
} nl_jbudget;
extern _Thread_local nl_jbudget *nl_jb;
/* -1 (an error set) when the budget is over or now goes over; 0 without a rendering. */
int nl_jb_charge(size_t bytes, uint64_t ops);
void nl_jb_release(size_t bytes);

/* ---- values ---- */
typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_FUNC, V_METHOD } vtype;

struct node;

struct nl_jv {
    vtype type;
    int rc;
    nl_jv *next; /* nl_jv_unref's worklist */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            char *s;
            uint8_t *taint;
            size_t n;
        } s; /* taint NULL: no data byte */
        struct {
            nl_jv **v;
            size_t n, cap;
        } l;
        /* keys are strings (V_DICT, V_NS); idx: a hash index of icap slots (entry + 1, 0 empty),
         * from 16 keys on */
        struct {
            nl_jv **k;
            nl_jv **v;
            size_t n, cap;
            uint32_t *idx;
            uint32_t icap;
        } d;
        const struct node *macro;
        int func; /* builtin id */
        struct {
            nl_jv *self;
            const char *name;
        } m;               /* bound method */
        const char *undef; /* the name that was looked up */
    } u;
};

typedef struct {
    char *s;
    uint8_t *t;
    size_t n, cap;
} buf;

/* ---- lexer ---- */
typedef enum {
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF
} ttype;

typedef struct {
    ttype type;
    int line;
    const char *s; /* source text (T_NAME, T_OP, T_INT, T_FLOAT); T_TEXT/T_STRING: decoded in str */
    size_t n;
    char *str; /* owned: decoded text or string literal */
    size_t str_n;
} token;

typedef struct {
    const char *label;
    char *src; /* newline-normalized copy */
    size_t len;
    token *tok;
    size_t n_tok, cap_tok;
    size_t *nl, n_nl; /* the offsets of the newlines in src */
} lexer;

/* ---- tree ---- */
typedef enum {
    /* expressions */
    N_LIT,
    N_NAME,
    N_ATTR,
    N_ITEM,
    N_SLICE,
    N_CALL,
    N_KWARG,
    N_FILTER,
    N_TEST,
    N_NOT,
    N_NEG,
    N_POS,
    N_BIN,
    N_AND,
    N_OR,
    N_COND,
    N_LIST,
    N_TUPLE,
    N_DICT,
    N_CONCAT,
    /* statements */
    S_BODY,
    S_TEXT,
    S_OUT,
    S_IF,
    S_FOR,
    S_SET,
    S_MACRO,
    S_BREAK,
    S_CONTINUE,
} nkind;

typedef enum {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FDIV,
    OP_MOD,
    OP_POW,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOTIN
} binop;

typedef struct node {
    nkind kind;
    int line;
    int op;     /* binop; N_TEST: negated */
    char *name; /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_KWARG, S_SET, S_MACRO */
    char *attr; /* S_SET: ns.attr */
    nl_jv *lit; /* N_LIT, S_TEXT */
    struct node *a, *b, *c;
    struct node **kids;
    int n_kids, cap_kids;
    char **names; /* S_FOR targets, S_MACRO parameters */
    int n_names;
    int filter_id;     /* N_FILTER / N_TEST: table index */
    struct node *next; /* node_free's worklist */
} node;

struct nl_jinja {
    char *label;
    node *root;
};

typedef enum {
    F_TRIM,
    F_LENGTH,
    F_COUNT,
    F_TOJSON,
    F_ITEMS,
    F_STRING,
    F_SAFE,
    F_JOIN,
    F_SELECT,
    F_REJECT,
    F_SELECTATTR,
    F_REJECTATTR,
    F_MAP,
    F_FIRST,
    F_LAST,
    F_LIST,
    F_DEFAULT,
    F_D,
    F_UPPER,
    F_LOWER,
    F_CAPITALIZE,
    F_TITLE,
    F_REPLACE,
    F_INT,
    F_FLOAT,
    F_ABS,
    F_REVERSE,
    F_DICTSORT,
    F_UNIQUE,
    F_INDENT,
    F_SORT,
    F_MIN,
    F_MAX,
    F_SUM,
    F_N
} filter_id;

typedef enum {
    TS_DEFINED,
    TS_UNDEFINED,
    TS_NONE,
    TS_STRING,
    TS_MAPPING,
    TS_ITERABLE,
    TS_SEQUENCE,
    TS_NUMBER,
    TS_INTEGER,
    TS_FLOAT,
    TS_BOOLEAN,
    TS_TRUE,
    TS_FALSE,
    TS_EQUALTO,
    TS_EQ,
    TS_EQEQ,
    TS_NE,
    TS_SAMEAS,
    TS_IN,
    TS_ODD,
    TS_EVEN,
    TS_DIVISIBLEBY,
    TS_CALLABLE,
    TS_LOWER,
    TS_UPPER,
    TS_GT,
    TS_LT,
    TS_GE,
    TS_LE,
    TS_N
} test_id;

enum { B_RAISE, B_NAMESPACE, B_RANGE, B_DICT, B_N };

extern const char *const nl_jinja_filter_names[F_N];
extern const char *const nl_jinja_test_names[TS_N];
extern const char *const nl_jinja_builtin_names[B_N];

/* ---- evaluator ---- */
typedef struct frame {
    nl_jv *vars; /* dict */
    struct frame *parent;
} frame;

typedef struct {
    const nl_jinja *t;
    const nl_jv *ctx;
    frame *root;
    int depth;
    const node *at; /* the node last evaluated: where a budget ran out */
    int brk;        /* 1 break, 2 continue pending */
} rstate;

/* ---- calls ---- */
typedef struct {
    nl_jv *pos[16];
    int n_pos;
    const char *kw_name[16];
    nl_jv *kw[16];
    int n_kw;
} args;

/* jinja_value.c */
nl_jv *nl_jv_new(vtype t);
nl_jv *nl_jv_ref(nl_jv *v);
nl_jv *nl_jv_float(double f);
nl_jv *nl_jv_undef(const char *name);
nl_jv *nl_jv_strt(const char *s, size_t n, const uint8_t *taint);
nl_jv *nl_jv_cstr(const char *s);
nl_jv *nl_jv_dict_getn(const nl_jv *d, const char *k, size_t n);
int nl_jv_dict_setv(nl_jv *d, nl_jv *key, nl_jv *v);
int nl_jbuf_add(buf *b, const char *s, size_t n, const uint8_t *taint, uint8_t flag);
int nl_jbuf_str(buf *b, const char *s);
int nl_jbuf_jv(buf *b, const nl_jv *v);
void nl_jbuf_free(buf *b);
nl_jv *nl_jbuf_take(buf *b);

/* jinja_lex.c */
int nl_jinja_lex(lexer *L);

/* jinja_parse.c */
int nl_jinja_find_name(const char *const *tab, int n, const char *s, size_t len);

/* jinja_eval.c */
int nl_jinja_rerr(const rstate *R, const node *n, const char *fmt, ...) NL_PRINTF(3, 4);
const char *nl_jinja_type_name(const nl_jv *v);
bool nl_jinja_truthy(const nl_jv *v);
bool nl_jinja_is_num(const nl_jv *v);
double nl_jinja_num_f(const nl_jv *v);
int64_t nl_jinja_num_i(const nl_jv *v);
int nl_jinja_to_str(buf *b, const nl_jv *v);
nl_jv *nl_jinja_str_of(const nl_jv *v);
int nl_jinja_to_json(buf *b, const nl_jv *v, int indent, int level, bool sort, const rstate *R, const node *at);
int nl_jinja_frame_set(frame *f, const char *name, nl_jv *v);
size_t nl_jinja_uspace_at(const char *s, size_t n, size_t i);
size_t nl_jinja_uspace_before(const char *s, size_t n, size_t end);
nl_jv *nl_jinja_substr(const nl_jv *s, size_t a, size_t b);
nl_jv *nl_jinja_strip(const nl_jv *s, int which, const nl_jv *chars);
nl_jv *nl_jinja_binop(rstate *R, const node *n, int op, nl_jv *a, nl_jv *b);
nl_jv *nl_jinja_method(nl_jv *self, const char *name);
nl_jv *nl_jinja_get_item(rstate *R, const node *n, nl_jv *obj, nl_jv *key);
nl_jv *nl_jinja_as_list(rstate *R, const node *n, const nl_jv *v);
nl_jv *nl_jinja_slice(rstate *R, const node *n, nl_jv *obj, nl_jv *const *parts);
nl_jv *nl_jinja_eval(rstate *R, frame *f, const node *n);
int nl_jinja_exec_body(rstate *R, frame *f, const node *body, buf *out);

/* jinja_call.c */
void nl_jinja_args_free(args *a);
int nl_jinja_eval_args(rstate *R, frame *f, const node *call, int first, args *a);
nl_jv *nl_jinja_call_value(rstate *R, frame *f, const node *n, nl_jv *fn, const args *a);
nl_jv *nl_jinja_apply_filter(rstate *R, frame *f, const node *n, int id, nl_jv *v, const args *a);
nl_jv *nl_jinja_apply_test(rstate *R, frame *f, const node *n, int id, nl_jv *v, const args *a);

#endif
