/* verify/json_schema: which bytes may come next in a JSON document valid
 * against a JSON Schema, for response_format json_schema (OpenAI's
 * structured outputs). The schema is compiled once to an immutable program
 * (sd_jschema, shared by every request and thread that uses it); each row
 * keeps a small copyable state fed bytes, like verify/json_mask: a token is
 * allowed where its bytes keep the text a prefix of a valid document, and an
 * end of text where the document is whole.
 *
 * The text: one JSON value of any type the schema allows, with no whitespace
 * before or after it; whitespace between tokens up to SD_JSON_MAX_WS bytes
 * in a row; strings take any byte >= 0x20 but '"' and '\' unescaped (UTF-8
 * is not checked, but in a string with a pattern: a token may hold part of
 * a character); numbers follow RFC 8259. Exact: feed fails at the first byte after which no valid document
 * (within the limits below) can follow, and never accepts an invalid one.
 *
 * The schema subset (anything else is refused at compile time with
 * SD_EINVAL and a message naming the keyword and where it is, e.g.
 * `json_schema: "patternProperties" at $.properties.tags is not supported`):
 *  - type: object, array, string, number, integer, boolean, null, or an
 *    array of them (integer with number is number). Without type, the
 *    keywords present say it (properties/required/additionalProperties:
 *    object; items/minItems/maxItems: array; minLength/maxLength: string);
 *    a schema with none of them, or `true`, is any JSON value.
 *  - properties, required, additionalProperties false. Keys come in the
 *    order of "properties", each at most once; required ones must appear,
 *    others may be left out; no other key - also when additionalProperties
 *    is absent or true (read as false: the generated text uses only the
 *    listed keys, which is valid either way). A key is matched as the
 *    exact text jansson writes for it (no other escapes of the same
 *    characters). An object with no properties listed and
 *    additionalProperties true is any object (keys and values free:
 *    pydantic's dict[str, Any]); with a schema there, any keys, each
 *    value of that schema (dict[str, X]). A schema for
 *    additionalProperties beside properties is refused.
 *  - items (one schema; absent: any value; false: none), minItems,
 *    maxItems; prefixItems (tuples, pydantic's tuple[int, str]: each
 *    position's schema, items past them; an array of 1 to 64 schemas).
 *  - minLength, maxLength, counted in code points: a UTF-8 lead byte, an
 *    escape, or a \u surrogate pair is one.
 *  - pattern (pydantic's constr(pattern=)): ECMA-262's meaning, a search
 *    (unanchored: "a" takes any string with an a; ^ and $ hold at the
 *    string's ends only), over the string's code points once decoded
 *    (escapes, surrogate pairs; its UTF-8 checked). The subset: ASCII
 *    literals, '.', classes [a-z0-9_] and [^...], escapes \d \w \s \D \W
 *    \S \t \n \r \v \f \0 \cX \xHH \uHHHH (ASCII) and of syntax
 *    characters (\. \- \\ ...), groups ( ), (?: ), (?<name> ), alternation,
 *    quantifiers * + ? {n} {n,} {n,m} (n, m to 1000; lazy ones too: the
 *    same strings match), ^ and $ anywhere. Beyond ASCII: '.' is any code
 *    point but U+2028/9 (and \n, \r), \s ECMA's white space (U+00A0,
 *    U+1680, U+2000-200A, U+2028/9, U+202F, U+205F, U+3000, U+FEFF), a
 *    negated class or \D \W \S any code point it does not exclude, a class
 *    of ASCII ranges none. Compiled to an automaton (at most 2048 states
 *    per pattern, 16384 over the schema); with minLength/maxLength (below
 *    65535), a character goes bad where no string of both follows. Refused,
 *    saying why: lookaround, backreferences, \b \B, \p{...}, non-ASCII
 *    characters, flags (?i), a lone { } ], and what does not fit. An enum's
 *    strings that do not match are dropped.
 *  - multipleOf on integers ("type" with integer, not number): an integer
 *    from 1 to 2^32 - 1, held exactly beside their bounds (a digit goes bad
 *    where no multiple within them begins with the text; any integer, past
 *    int64 too, without them); bounds that hold none are refused; an
 *    enum's numbers that are not multiples are dropped.
 *  - minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers) with
 *    a "type" (refused without one; they bound the integers and numbers
 *    among its types; an enum's numbers outside them are dropped). With
 *    "type" integer (beside other types but number), read as the 64-bit
 *    integers they admit (a side with no bound, or one at int64's end,
 *    takes any integer). With number: the number is read with no
 *    exponent, at most 15 digits from its first nonzero one and 20
 *    decimals, and compared with each bound's shortest round-trip decimal
 *    exactly, which is how a validator comparing the two as doubles
 *    decides (two such decimals are never within one double's rounding);
 *    bounds that admit no such number are refused. A digit goes bad where
 *    no value of the bounds can begin with the text (pydantic's
 *    Field(ge=, le=), on int and float fields).
 *  - enum, const: JSON scalars only, matched as exact text: a string as
 *    jansson writes it, an integer in decimal, a real in its shortest
 *    round-trip form ("%g"; an integral one without a fraction, 2.0 as
 *    "2"). Values not of the schema's type or length are dropped.
 *  - anyOf; oneOf only where its branches provably exclude each other (by
 *    type, by enum/const values, by a required key the other - closed by
 *    an explicit additionalProperties false - object lacks, or by such a
 *    key required in both whose schemas exclude each other), when it is
 *    read as anyOf.
 *  - $ref to "#", "#/$defs/NAME" or "#/definitions/NAME" (the root's),
 *    recursion included; allOf of a single schema (read as that schema).
 *    A $ref, anyOf, oneOf or allOf with other constraining keywords beside
 *    it is refused.
 *  - ignored: description, title, default, examples, $schema, $comment,
 *    deprecated, readOnly, writeOnly, $id (at the root), $defs/definitions,
 *    uniqueItems false, unevaluatedProperties false, and format (an
 *    annotation in JSON Schema 2020-12: not enforced).
 *  - refused: patternProperties, not, allOf of several, if/then/else,
 *    multipleOf on numbers, items as an array (the old tuple form), contains,
 *    min/maxProperties, propertyNames, dependent*, boolean schema false,
 *    object or array values in enum/const, and unknown keywords.
 *
 * Alternatives (anyOf, type unions) are followed together: the state keeps,
 * per open value, the set of schema alternatives still alive (at most
 * SD_JSCHEMA_MAX_ALT), each knowing which alternatives of the enclosing
 * value it belongs to, so a nested value that fails one branch kills the
 * branches it came from and no others. The enum/const branches of an anyOf
 * are merged into one enum (an anyOf of many consts is one alternative).
 * Compilation checks (over every set
 * of alternatives that can be alive at once) that no value opens more than
 * SD_JSCHEMA_MAX_ALT and lowers the nesting limit of the schema (at least
 * SD_JSCHEMA_POOL / SD_JSCHEMA_MAX_ALT - 1) so that all open values fit
 * SD_JSCHEMA_POOL; sd_jschema_max_depth says the limit.
 *
 * Limits: nesting SD_JSCHEMA_MAX_DEPTH containers (or the schema's lower
 * limit); SD_JSCHEMA_MAX_NODES schemas (after $ref); SD_JSCHEMA_MAX_PROPS
 * properties per object; SD_JSCHEMA_MAX_ENUM values per enum;
 * SD_JSCHEMA_MAX_TEXT bytes per key or enum value text;
 * SD_JSCHEMA_MAX_SCHEMA bytes of schema text. A document is also held to
 * the nesting it can reach: an optional key or item whose schema needs more
 * nesting than is left is not allowed to begin.
 *
 * Feed costs, per byte, a few operations per live alternative (a key or
 * enum byte scans the candidates that share its prefix; a byte within a
 * patterned string's multi-byte character, its automaton's classes); no
 * allocation.
 *
 * Tool calls in a model's own format (a forced tool_choice; specd's
 * extension, the only key of the schema object):
 *   {"x-specd-calls": {"begin": B, "sep": S, "end": E, "max": M,
 *                      "tools": [{"prefix": P, "parameters": SCHEMA, "suffix": X}, ...]}}
 * is the text of 1 to M calls, then E: the first call B P_i DOC_i X_i, each
 * next one S P_j DOC_j X_j, where DOC_i is a document of tool i's
 * parameters (an object schema, compiled as a root of its own: its $ref
 * "#" and $defs are its own). A prefix may hold one byte 0x01, which stands
 * for 1 to 4 ASCII digits (Kimi-K2's call number). E.g. Qwen's
 * <tool_call> blocks: B = "<tool_call>\n{\"name\": \"", P_i = NAME
 * "\", \"arguments\": ", X_i = "}\n</tool_call>", S = "\n" B, E = "".
 * Refused: a prefix that is another's prefix (with B or S before it, the
 * text must say which tool it is when its prefix ends), an end that one
 * call's lead and prefix begins (S P_i a prefix of E), parameters that
 * may be anything but an object (a number would not know where it ends),
 * more than 128 tools, M outside 1..16. The text may end (done) once M or
 * fewer calls and E are whole. "specials": true says the literals hold
 * special tokens' text: the caller feeds those tokens' text like any
 * other's (sd_jschema_takes_specials).
 *
 * A reply that begins inside the model's reasoning (a chat template whose
 * prompt ends with <think>): {"x-specd-after": A, "x-specd-then": S,
 * "specials"?: bool} is any text up to and including the first A (1 to 64
 * bytes), then a text of S (a schema, or x-specd-calls). "specials": A may
 * be a special token's text. With "x-specd-open": O (a model that may open
 * its reasoning itself, Qwen3's), the reasoning is optional: a text of S,
 * or O, any text up to the first A, then a text of S. */
#ifndef SD_VERIFY_JSON_SCHEMA_H
#define SD_VERIFY_JSON_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "verify/json_mask.h" /* SD_JSON_MAX_WS */

#define SD_JSCHEMA_MAX_DEPTH 32
#define SD_JSCHEMA_MAX_ALT 16
#define SD_JSCHEMA_POOL 48
#define SD_JSCHEMA_MAX_NODES 4000
#define SD_JSCHEMA_MAX_PROPS 1000
#define SD_JSCHEMA_MAX_ENUM 1000
#define SD_JSCHEMA_MAX_TEXT 1000
#define SD_JSCHEMA_MAX_SCHEMA (1 << 20)

typedef struct sd_jschema sd_jschema;

/* one live alternative of an open value */
typedef struct sd_jschema_alt {
    uint16_t node;    /* its schema (12 bits); bit 15: a string's pending high surrogate */
    uint16_t parents; /* bit i: the i-th alternative of the enclosing value */
    uint16_t a, b;    /* object: key candidate / key / next key, and key offset;
                       * array, string: count (a | b << 16); enum: value, offset;
                       * a string with a pattern: count, its automaton's state;
                       * an integer with multipleOf: remainder (a | b << 16) */
} sd_jschema_alt;

typedef struct sd_jschema_state {
    /* in a schema with bounds: a number's digits so far (its integer
     * part, then its decimals; saturating past 2^63), its sign and the
     * decimals among them; 0 outside numbers and in other schemas */
    uint64_t nmag;
    uint8_t nneg, nfrac;
    /* in a schema with a pattern: a string's character being decoded (its
     * UTF-8 bits or \u digits so far) and how it goes on; 0 elsewhere */
    uint8_t sdec;
    uint32_t scp;
    /* tool calls (x-specd-calls; all 0 otherwise): the phase (lead and
     * prefix, digits, document, suffix, done), calls whole, whether the end
     * may still be meant, digits read, bytes matched of the literal, and the
     * tools alive [clo, chi) (the call's tool: clo) */
    uint8_t cph, ncall, cend, cdig;
    uint16_t cpos, clo, chi;
    /* x-specd-after: 1 while in the text before it, 2 while the text may
     * still open it (x-specd-open), and the bytes of A (1) or O (2)
     * matched; pbad: (2) the reply's text already went bad, O alone alive */
    uint8_t pre, pbad;
    uint16_t pmatch;
    uint8_t mode, sub, ws, bad;            /* syntax, as in json_mask */
    uint8_t nlev;                          /* open values (containers, and a scalar) */
    uint8_t nalt;                          /* alternatives in use */
    uint8_t lev[SD_JSCHEMA_MAX_DEPTH + 1]; /* each value's first alternative;
                                            * bit 7: an object */
    sd_jschema_alt alt[SD_JSCHEMA_POOL];   /* values' alternatives, outermost first */
} sd_jschema_state;

/* Compiles the schema (the "schema" member of response_format.json_schema,
 * as JSON text). 0, or SD_EINVAL / SD_ENOMEM with err naming the fault. */
int sd_jschema_compile(const char *schema_json, size_t len, sd_jschema **out, sd_err *err);
void sd_jschema_free(sd_jschema *s);
/* the most containers a document may nest */
int sd_jschema_max_depth(const sd_jschema *s);
/* this compilation's number, never another's in the process (from 1) */
uint64_t sd_jschema_serial(const sd_jschema *s);

void sd_jschema_init(const sd_jschema *s, sd_jschema_state *st);
/* A copy of src: only the part in use (cheaper than assigning the struct). */
void sd_jschema_copy(sd_jschema_state *dst, const sd_jschema_state *src);
/* Feeds n bytes; 0 while the text is a prefix of a document valid against
 * the schema, -1 once it is not (the state stays bad). */
int sd_jschema_feed(const sd_jschema *s, sd_jschema_state *st, const unsigned char *b, size_t n);
/* 1 when the text is a whole valid document (and nothing but it). */
int sd_jschema_done(const sd_jschema *s, const sd_jschema_state *st);
/* 1: tool calls (x-specd-calls); 0: a document */
int sd_jschema_calls(const sd_jschema *s);
/* 1 where literals (the calls', x-specd-after's) may be special tokens'
 * text ("specials"): the caller feeds special tokens' text to it */
int sd_jschema_takes_specials(const sd_jschema *s);
/* the literal phases of tool calls and the text before x-specd-after's:
 * where a special token's text may be next (a document never takes one) */
int sd_jschema_in_literal(const sd_jschema_state *st);
/* 1 when a and b (copies made by sd_jschema_copy or init, fed) are the
 * same state: they take the same bytes from here on. */
int sd_jschema_equal(const sd_jschema_state *a, const sd_jschema_state *b);

#endif
