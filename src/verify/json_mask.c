#include "verify/json_mask.h"

#include <string.h>

/* what comes next */
enum {
    M_START,        /* the top-level '{' */
    M_KEY_OR_END,   /* after '{': a key or '}' */
    M_KEY,          /* after ',' in an object: a key */
    M_COLON,        /* after a key */
    M_VALUE,        /* after ':' or ',' in an array */
    M_VALUE_OR_END, /* after '[': a value or ']' */
    M_AFTER_VALUE,  /* ',' or the container's closer */
    M_STR_KEY,      /* in a key (sub: 0, 1 after '\', 2..5 in \u's hex digits) */
    M_STR_VAL,      /* in a string value (sub as above) */
    M_NUMBER,       /* in a number (sub: N_*) */
    M_LITERAL,      /* in true / false / null (sub: literal << 4 | bytes matched) */
    M_DONE,         /* the object is whole */
};

/* a number's parts: which may end it (RFC 8259's grammar) */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const LITERALS[3] = {"true", "false", "null"};

void sd_json_init(sd_json_state *s)
{
    memset(s, 0, sizeof *s);
    s->mode = M_START;
}

int sd_json_equal(const sd_json_state *a, const sd_json_state *b)
{
    return a->mode == b->mode && a->sub == b->sub && a->ws == b->ws && a->bad == b->bad &&
           a->depth == b->depth &&
           (a->depth <= 0 || !memcmp(a->stack, b->stack, (size_t)a->depth * sizeof a->stack[0]));
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int bad(sd_json_state *s)
{
    s->bad = 1;
    return -1;
}

/* a value ended: the container's next, or the end */
static void value_done(sd_json_state *s) { s->mode = s->depth == 0 ? M_DONE : M_AFTER_VALUE; }

static int push(sd_json_state *s, unsigned char c)
{
    if (s->depth == SD_JSON_MAX_DEPTH)
        return bad(s);
    s->stack[s->depth++] = c;
    s->mode = c == '{' ? M_KEY_OR_END : M_VALUE_OR_END;
    return 0;
}

static int pop(sd_json_state *s, unsigned char c)
{
    if (s->depth == 0 || s->stack[s->depth - 1] != (c == '}' ? '{' : '['))
        return bad(s);
    s->depth--;
    value_done(s);
    return 0;
}

/* the first byte of a value */
static int value(sd_json_state *s, unsigned char c)
{
    s->sub = 0;
    if (c == '"') {
        s->mode = M_STR_VAL;
    } else if (c == '{' || c == '[') {
        return push(s, c);
    } else if (c == '-' || is_digit(c)) {
        s->mode = M_NUMBER;
        s->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
    } else if (c == 't' || c == 'f' || c == 'n') {
        s->mode = M_LITERAL;
        s->sub = (uint8_t)((c == 't' ? 0 : c == 'f' ? 1 : 2) << 4 | 1);
    } else {
        return bad(s);
    }
    return 0;
}

/* one byte inside a string (key or value) */
static int string_byte(sd_json_state *s, unsigned char c)
{
    if (s->sub == 1) { /* after '\' */
        if (c == 'u')
            s->sub = 2;
        else if (strchr("\"\\/bfnrt", c) && c)
            s->sub = 0;
        else
            return bad(s);
        return 0;
    }
    if (s->sub >= 2) { /* \u's four hex digits */
        if (!is_hex(c))
            return bad(s);
        s->sub = s->sub == 5 ? 0 : (uint8_t)(s->sub + 1);
        return 0;
    }
    if (c < 0x20)
        return bad(s);
    if (c == '\\') {
        s->sub = 1;
    } else if (c == '"') {
        if (s->mode == M_STR_KEY)
            s->mode = M_COLON;
        else
            value_done(s);
    }
    return 0;
}

static int step(sd_json_state *s, unsigned char c);

/* one byte inside a number; a byte that cannot go on it ends it (where it
 * may end) and is read again after it */
static int number_byte(sd_json_state *s, unsigned char c)
{
    switch (s->sub) {
    case N_MINUS:
        if (!is_digit(c))
            return bad(s);
        s->sub = c == '0' ? N_ZERO : N_INT;
        return 0;
    case N_ZERO:
    case N_INT:
        if (s->sub == N_INT && is_digit(c))
            return 0;
        if (c == '.') {
            s->sub = N_DOT;
            return 0;
        }
        if (c == 'e' || c == 'E') {
            s->sub = N_E;
            return 0;
        }
        break;
    case N_DOT:
        if (!is_digit(c))
            return bad(s);
        s->sub = N_FRAC;
        return 0;
    case N_FRAC:
        if (is_digit(c))
            return 0;
        if (c == 'e' || c == 'E') {
            s->sub = N_E;
            return 0;
        }
        break;
    case N_E:
        if (c == '+' || c == '-') {
            s->sub = N_ESIGN;
            return 0;
        }
        /* fall through */ /* (a digit) */
    case N_ESIGN:
        if (!is_digit(c))
            return bad(s);
        s->sub = N_EXP;
        return 0;
    case N_EXP:
        if (is_digit(c))
            return 0;
        break;
    }
    /* the number ended before c */
    value_done(s);
    return step(s, c);
}

static int step(sd_json_state *s, unsigned char c)
{
    switch (s->mode) {
    case M_STR_KEY:
    case M_STR_VAL: return string_byte(s, c);
    case M_NUMBER: return number_byte(s, c);
    case M_LITERAL: {
        const char *lit = LITERALS[s->sub >> 4];
        int at = s->sub & 15;
        if ((unsigned char)lit[at] != c)
            return bad(s);
        if (lit[at + 1] == 0)
            value_done(s);
        else
            s->sub = (uint8_t)((s->sub & 0xf0) | (at + 1));
        return 0;
    }
    default: break;
    }
    /* between tokens of JSON: whitespace, capped; none before the object
     * or after it (the text is the object: the end of text comes next) */
    if (is_ws(c) && (s->mode == M_START || s->mode == M_DONE))
        return bad(s);
    if (is_ws(c)) {
        if (++s->ws > SD_JSON_MAX_WS)
            return bad(s);
        return 0;
    }
    s->ws = 0;
    switch (s->mode) {
    case M_START: return c == '{' ? push(s, c) : bad(s);
    case M_KEY_OR_END:
        if (c == '}')
            return pop(s, c);
        /* fall through */ /* (a key) */
    case M_KEY:
        if (c != '"')
            return bad(s);
        s->mode = M_STR_KEY;
        s->sub = 0;
        return 0;
    case M_COLON:
        if (c != ':')
            return bad(s);
        s->mode = M_VALUE;
        return 0;
    case M_VALUE_OR_END:
        if (c == ']')
            return pop(s, c);
        return value(s, c);
    case M_VALUE: return value(s, c);
    case M_AFTER_VALUE:
        if (c == '}' || c == ']')
            return pop(s, c);
        if (c != ',')
            return bad(s);
        s->mode = s->stack[s->depth - 1] == '{' ? M_KEY : M_VALUE;
        return 0;
    default: /* M_DONE: nothing */
        return bad(s);
    }
}

int sd_json_feed(sd_json_state *s, const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n && !s->bad; i++)
        step(s, b[i]);
    return s->bad ? -1 : 0;
}

int sd_json_done(const sd_json_state *s) { return !s->bad && s->mode == M_DONE; }
