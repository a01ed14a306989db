/* verify/json_mask: which bytes may come next in a JSON object (RFC 8259),
 * for response_format json_object: a pushdown automaton fed bytes; a token
 * is allowed where its bytes keep the text a prefix of a JSON object, and an
 * end of text where the object is complete.
 *
 * The top-level value is an object, with no whitespace before or after it
 * (the text is the object); whitespace between tokens of JSON is allowed up
 * to SD_JSON_MAX_WS bytes in a row (a model could otherwise pad forever);
 * strings take any byte >= 0x20 but '"' and '\' unescaped (UTF-8
 * is not checked: a token may hold part of a character); numbers follow the
 * RFC's grammar; nesting is limited to SD_JSON_MAX_DEPTH. Pure functions of
 * the state: no allocation. */
#ifndef SD_VERIFY_JSON_MASK_H
#define SD_VERIFY_JSON_MASK_H

#include <stddef.h>
#include <stdint.h>

#define SD_JSON_MAX_DEPTH 64
#define SD_JSON_MAX_WS 32

typedef struct sd_json_state {
    uint8_t mode;  /* what comes next (json_mask.c) */
    uint8_t sub;   /* within a string escape, number or literal */
    uint8_t ws;    /* whitespace bytes in a row */
    uint8_t bad;   /* the text is no prefix of a JSON object */
    int16_t depth; /* open containers */
    uint8_t stack[SD_JSON_MAX_DEPTH]; /* '{' or '[' per level */
} sd_json_state;

void sd_json_init(sd_json_state *s);
/* Feeds n bytes; returns 0 while the text is a prefix of a JSON object,
 * -1 once it is not (the state stays bad). */
int sd_json_feed(sd_json_state *s, const unsigned char *b, size_t n);
/* 1 when the text is a whole JSON object (and nothing but it). */
int sd_json_done(const sd_json_state *s);
/* 1 when a and b take the same bytes from here on (the same state). */
int sd_json_equal(const sd_json_state *a, const sd_json_state *b);

#endif
