/*
 * test_vectors: runs the shared protocol vectors (clients/vectors.json) against a fresh
 * broker with the C client: frames out through relay_send_frames, replies in through
 * relay_recv_reply, matched against each vector; error replies must give the typed
 * code through relay_reply_error, and well-formed error requests must fail with that
 * code through relay_request too.
 *
 *   test_vectors VECTORS_JSON ROUTER_ADDRESS
 *
 * Prints one line per vector and "N passed, N failed"; exits 1 on any failure.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "relay.h"

/* ------------------------------------------------------------------ JSON -> msgpack */

static void pack_json(msgpack_packer *pk, json_t *value) {
    switch (json_typeof(value)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *item;
        msgpack_pack_map(pk, (uint32_t)json_object_size(value));
        json_object_foreach(value, key, item) {
            msgpack_pack_str(pk, strlen(key));
            msgpack_pack_str_body(pk, key, strlen(key));
            pack_json(pk, item);
        }
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *item;
        msgpack_pack_array(pk, (uint32_t)json_array_size(value));
        json_array_foreach(value, i, item) pack_json(pk, item);
        break;
    }
    case JSON_STRING:
        msgpack_pack_str(pk, json_string_length(value));
        msgpack_pack_str_body(pk, json_string_value(value), json_string_length(value));
        break;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, json_integer_value(value));
        break;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(value));
        break;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        break;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        break;
    case JSON_NULL:
        msgpack_pack_nil(pk);
        break;
    }
}

/* ------------------------------------------------------------------ matching */

static int is_int(const msgpack_object *o) {
    return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
}

static int is_float(const msgpack_object *o) {
    return o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64;
}

static double number(const msgpack_object *o) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (double)o->via.u64;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return (double)o->via.i64;
    return o->via.f64;
}

static int str_equals(const msgpack_object *o, const char *s, size_t n) {
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}

/* 0 when `actual` has the shape `expected` describes; else 1 with `why` filled. */
static int mismatch(json_t *expected, const msgpack_object *actual, const char *where, char *why,
                    size_t size) {
    char path[512];
    switch (json_typeof(expected)) {
    case JSON_STRING: {
        const char *s = json_string_value(expected);
        size_t n = json_string_length(expected);
        if (s[0] == '$') {
            int ok;
            if (strcmp(s, "$str") == 0) ok = actual->type == MSGPACK_OBJECT_STR;
            else if (strcmp(s, "$int") == 0) ok = is_int(actual);
            else if (strcmp(s, "$num") == 0) ok = is_int(actual) || is_float(actual);
            else if (strcmp(s, "$bool") == 0) ok = actual->type == MSGPACK_OBJECT_BOOLEAN;
            else if (strcmp(s, "$map") == 0) ok = actual->type == MSGPACK_OBJECT_MAP;
            else if (strcmp(s, "$list") == 0) ok = actual->type == MSGPACK_OBJECT_ARRAY;
            else if (strcmp(s, "$nil") == 0) ok = actual->type == MSGPACK_OBJECT_NIL;
            else if (strcmp(s, "$any") == 0) ok = 1;
            else {
                snprintf(why, size, "%s: unknown type %s in the vector", where, s);
                return 1;
            }
            if (!ok) snprintf(why, size, "%s: expected %s, got msgpack type %d", where, s, actual->type);
            return !ok;
        }
        if (!str_equals(actual, s, n)) {
            snprintf(why, size, "%s: expected \"%s\"", where, s);
            return 1;
        }
        return 0;
    }
    case JSON_INTEGER:
        if (!(is_int(actual) || is_float(actual)) ||
            number(actual) != (double)json_integer_value(expected) ||
            (actual->type == MSGPACK_OBJECT_POSITIVE_INTEGER && json_integer_value(expected) < 0) ||
            (actual->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
             actual->via.u64 != (uint64_t)json_integer_value(expected))) {
            snprintf(why, size, "%s: expected %" JSON_INTEGER_FORMAT, where, json_integer_value(expected));
            return 1;
        }
        return 0;
    case JSON_REAL:
        if (!(is_int(actual) || is_float(actual)) || number(actual) != json_real_value(expected)) {
            snprintf(why, size, "%s: expected %g", where, json_real_value(expected));
            return 1;
        }
        return 0;
    case JSON_TRUE:
    case JSON_FALSE:
        if (actual->type != MSGPACK_OBJECT_BOOLEAN || actual->via.boolean != json_is_true(expected)) {
            snprintf(why, size, "%s: expected %s", where, json_is_true(expected) ? "true" : "false");
            return 1;
        }
        return 0;
    case JSON_NULL:
        if (actual->type != MSGPACK_OBJECT_NIL) {
            snprintf(why, size, "%s: expected nil", where);
            return 1;
        }
        return 0;
    case JSON_ARRAY: {
        if (actual->type != MSGPACK_OBJECT_ARRAY || actual->via.array.size != json_array_size(expected)) {
            snprintf(why, size, "%s: expected a list of %zu", where, json_array_size(expected));
            return 1;
        }
        size_t i;
        json_t *item;
        json_array_foreach(expected, i, item) {
            snprintf(path, sizeof path, "%s[%zu]", where, i);
            if (mismatch(item, &actual->via.array.ptr[i], path, why, size)) return 1;
        }
        return 0;
    }
    case JSON_OBJECT: {
        if (actual->type != MSGPACK_OBJECT_MAP) {
            snprintf(why, size, "%s: expected a map", where);
            return 1;
        }
        const char *key;
        json_t *item;
        json_object_foreach(expected, key, item) {
            const msgpack_object *value = relay_map_get(actual, key);
            snprintf(path, sizeof path, "%s.%s", where, key);
            if (!value) {
                snprintf(why, size, "%s: missing", path);
                return 1;
            }
            if (mismatch(item, value, path, why, size)) return 1;
        }
        return 0;
    }
    }
    return 0;
}

/* ------------------------------------------------------------------ frames */

typedef struct {
    relay_frame frames[8];
    char *owned[8];
    size_t count;
} frames;

static void frames_free(frames *f) {
    for (size_t i = 0; i < f->count; i++) free(f->owned[i]);
}

static void add_owned(frames *f, char *data, size_t size) {
    f->owned[f->count] = data;
    f->frames[f->count].data = data;
    f->frames[f->count].size = size;
    f->count++;
}

static void add_msgpack(frames *f, json_t *value) {
    msgpack_sbuffer sbuf;
    msgpack_sbuffer_init(&sbuf);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);
    pack_json(&pk, value);
    add_owned(f, sbuf.data, sbuf.size); /* sbuf.data is malloc'ed: freed with the frames */
}

static int build_frames(json_t *vector, frames *f) {
    memset(f, 0, sizeof *f);
    json_t *request = json_object_get(vector, "request");
    if (request) {
        add_owned(f, strdup("RLY1"), 4);
        add_msgpack(f, request);
        return 0;
    }
    size_t i;
    json_t *spec;
    json_array_foreach(json_object_get(vector, "frames"), i, spec) {
        if (f->count == 8) return -1;
        json_t *value;
        if ((value = json_object_get(spec, "text"))) {
            add_owned(f, strdup(json_string_value(value)), json_string_length(value));
        } else if ((value = json_object_get(spec, "hex"))) {
            const char *hex = json_string_value(value);
            size_t n = strlen(hex) / 2;
            char *bytes = malloc(n + 1);
            for (size_t k = 0; k < n; k++) {
                unsigned int byte;
                sscanf(hex + 2 * k, "%2x", &byte);
                bytes[k] = (char)byte;
            }
            add_owned(f, bytes, n);
        } else if ((value = json_object_get(spec, "msgpack"))) {
            add_msgpack(f, value);
        } else {
            return -1;
        }
    }
    return 0;
}

/* The request's fields other than op and rid, packed; their count. */
static size_t pack_fields(json_t *request, msgpack_sbuffer *sbuf) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, sbuf, msgpack_sbuffer_write);
    const char *key;
    json_t *item;
    size_t count = 0;
    json_object_foreach(request, key, item) {
        if (strcmp(key, "op") == 0 || strcmp(key, "rid") == 0) continue;
        msgpack_pack_str(&pk, strlen(key));
        msgpack_pack_str_body(&pk, key, strlen(key));
        pack_json(&pk, item);
        count++;
    }
    return count;
}

static int run_vector(relay_client *raw, relay_client *typed, json_t *vector, char *why, size_t size) {
    frames f;
    if (build_frames(vector, &f) < 0) {
        frames_free(&f);
        snprintf(why, size, "cannot build the frames");
        return 1;
    }
    relay_error err;
    int rc = relay_send_frames(raw, f.frames, f.count, &err);
    frames_free(&f);
    if (rc < 0) {
        snprintf(why, size, "send: %s", err.message);
        return 1;
    }
    relay_reply reply;
    if (relay_recv_reply(raw, 15000, &reply, &err) < 0) {
        snprintf(why, size, "%s: %s", err.name, err.message);
        return 1;
    }
    json_t *expected = json_object_get(vector, "reply");
    int failed = mismatch(expected, &reply.body, "reply", why, size);
    if (!failed && !json_is_true(json_object_get(expected, "ok"))) {
        const char *code = json_string_value(json_object_get(json_object_get(expected, "error"), "code"));
        relay_reply_error(&reply, &err);
        if (err.code == RELAY_E_OTHER || err.code != relay_code_from_name(code) ||
            strcmp(err.name, code) != 0 || strcmp(relay_code_name(err.code), code) != 0) {
            snprintf(why, size, "typed error %d (%s) for %s", err.code, err.name, code);
            failed = 1;
        }
        /* Well-formed requests: through relay_request too. */
        json_t *request = json_object_get(vector, "request");
        json_t *op = json_object_get(request, "op");
        json_t *rid = json_object_get(request, "rid");
        if (!failed && json_is_string(op) && json_is_integer(rid) && json_integer_value(rid) >= 0) {
            msgpack_sbuffer sbuf;
            msgpack_sbuffer_init(&sbuf);
            size_t count = pack_fields(request, &sbuf);
            relay_reply ok_reply;
            rc = relay_request(typed, json_string_value(op), sbuf.data, sbuf.size, count, &ok_reply, &err);
            msgpack_sbuffer_destroy(&sbuf);
            if (rc == 0) {
                relay_reply_destroy(&ok_reply);
                snprintf(why, size, "relay_request succeeded; expected %s", code);
                failed = 1;
            } else if (err.code != relay_code_from_name(code)) {
                snprintf(why, size, "relay_request gave %s, expected %s", err.name, code);
                failed = 1;
            }
        }
    }
    relay_reply_destroy(&reply);
    return failed;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_vectors VECTORS_JSON ROUTER_ADDRESS\n");
        return 2;
    }
    json_error_t jerr;
    json_t *root = json_load_file(argv[1], 0, &jerr);
    if (!root) {
        fprintf(stderr, "%s:%d: %s\n", argv[1], jerr.line, jerr.text);
        return 2;
    }
    relay_error err;
    relay_client *raw = relay_connect(argv[2], 15000, &err);
    relay_client *typed = raw ? relay_connect(argv[2], 15000, &err) : NULL;
    if (!raw || !typed) {
        fprintf(stderr, "connect: %s: %s\n", err.name, err.message);
        return 1;
    }
    int passed = 0, failed = 0;
    size_t i;
    json_t *vector;
    json_array_foreach(json_object_get(root, "vectors"), i, vector) {
        char why[1024] = "";
        const char *name = json_string_value(json_object_get(vector, "name"));
        if (run_vector(raw, typed, vector, why, sizeof why)) {
            printf("not ok %zu - %s: %s\n", i + 1, name, why);
            failed++;
        } else {
            printf("ok %zu - %s\n", i + 1, name);
            passed++;
        }
    }
    relay_close(typed);
    relay_close(raw);
    json_decref(root);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : (passed ? 0 : 1);
}
