/* relay.c: see relay.h. libzmq + msgpack-c. */
#define _POSIX_C_SOURCE 200809L

#include "relay.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#define MAGIC "RLY1"
#define MAGIC_SIZE 4
#define MAX_FRAMES 8
#define HEARTBEAT_MS 1000
#define MAX_SUBS 64 /* subscriptions renewed after the router lost them */

static const char *const CODE_NAMES[] = {
    [RELAY_OK] = "ok",
    [RELAY_E_MALFORMED_FRAME] = "malformed_frame",
    [RELAY_E_UNSUPPORTED_VERSION] = "unsupported_version",
    [RELAY_E_UNKNOWN_OPERATION] = "unknown_operation",
    [RELAY_E_INVALID_MESSAGE] = "invalid_message",
    [RELAY_E_INVALID_SUBJECT] = "invalid_subject",
    [RELAY_E_PAYLOAD_TOO_LARGE] = "payload_too_large",
    [RELAY_E_LIMIT_EXCEEDED] = "limit_exceeded",
    [RELAY_E_ENDPOINT_NOT_FOUND] = "endpoint_not_found",
    [RELAY_E_MESSAGE_NOT_FOUND] = "message_not_found",
    [RELAY_E_ALREADY_CLAIMED] = "already_claimed",
    [RELAY_E_INVALID_STATE] = "invalid_state",
    [RELAY_E_ACCESS_DENIED] = "access_denied",
    [RELAY_E_INVALID_CONFIG] = "invalid_config",
    [RELAY_E_STORAGE_ERROR] = "storage_error",
    [RELAY_E_UNAVAILABLE] = "unavailable",
    [RELAY_E_TIMEOUT] = "timeout",
    [RELAY_E_INTERNAL] = "internal",
    [RELAY_E_SENDER_NOT_ALLOWED] = "sender_not_allowed",
    [RELAY_E_NOT_AUTHORIZED] = "not_authorized",
    [RELAY_E_TTL_EXPIRED] = "ttl_expired",
    [RELAY_E_OTHER] = "other",
};

const char *relay_code_name(relay_code code) {
    if ((int)code < 0 || code > RELAY_E_OTHER) return "other";
    return CODE_NAMES[code];
}

relay_code relay_code_from_name(const char *name) {
    for (int code = RELAY_E_MALFORMED_FRAME; code < RELAY_E_OTHER; code++) {
        if (name && strcmp(name, CODE_NAMES[code]) == 0) return (relay_code)code;
    }
    return RELAY_E_OTHER;
}

static int fail(relay_error *err, relay_code code, const char *fmt, ...) {
    if (err) {
        err->code = code;
        snprintf(err->name, sizeof err->name, "%s", relay_code_name(code));
        va_list args;
        va_start(args, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, args);
        va_end(args);
    }
    return -1;
}

/* ------------------------------------------------------------------ messages queue */

typedef struct queued {
    relay_message message;
    struct queued *next;
} queued;

typedef struct {
    int used;
    int lost;          /* missing from the last ping's subs: to subscribe again */
    uint64_t first_id; /* the id relay_subscribe returned */
    uint64_t id;       /* the id the router knows now */
    int credit;
    char pattern[260];
} sub_entry;

struct relay_client {
    void *ctx;
    void *dealer;
    char address[512];
    char signals[512];
    int timeout_ms;
    uint64_t rid;
    int64_t last_sent_ms;
    queued *head, *tail;
    sub_entry subs[MAX_SUBS];
};

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void relay_message_destroy(relay_message *message) {
    if (message) {
        free(message->data);
        message->data = NULL;
        message->size = 0;
    }
}

void relay_reply_destroy(relay_reply *reply) {
    if (reply && reply->buffer_) {
        msgpack_unpacked_destroy(&reply->unpacked_);
        free(reply->buffer_);
        reply->buffer_ = NULL;
    }
}

/* ------------------------------------------------------------------ msgpack helpers */

static void pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

const msgpack_object *relay_map_get(const msgpack_object *map, const char *key) {
    if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
            memcmp(k->via.str.ptr, key, n) == 0) {
            return &map->via.map.ptr[i].val;
        }
    }
    return NULL;
}

/* Copy a str object into buf (truncated, NUL-terminated); 0 when it is no string. */
static int copy_str(const msgpack_object *o, char *buf, size_t size) {
    if (!o || o->type != MSGPACK_OBJECT_STR || size == 0) return 0;
    size_t n = o->via.str.size < size - 1 ? o->via.str.size : size - 1;
    memcpy(buf, o->via.str.ptr, n);
    buf[n] = '\0';
    return 1;
}

/* ---------------------------------------------------------------- envelope fields
   Enough JSON to find a top-level string of an envelope: a value is skipped by its
   shape (strings with their escapes, brackets counted outside strings), never parsed. */

static const char *json_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* Past the string whose opening quote is at p; NULL when it does not end. */
static const char *json_skip_string(const char *p) {
    for (p++; *p; p++) {
        if (*p == '\\') {
            if (!*++p) return NULL;
        } else if (*p == '"') {
            return p + 1;
        }
    }
    return NULL;
}

/* Past the value at p (whitespace before it skipped); NULL when it is malformed. */
static const char *json_skip_value(const char *p) {
    p = json_ws(p);
    if (*p == '"') return json_skip_string(p);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (*p) {
            if (*p == '"') {
                p = json_skip_string(p);
                if (!p) return NULL;
                continue;
            }
            if (*p == '{' || *p == '[') depth++;
            else if ((*p == '}' || *p == ']') && --depth == 0) return p + 1;
            p++;
        }
        return NULL;
    }
    const char *start = p; /* a number, true, false or null */
    while (*p && strchr(",}] \t\n\r", *p) == NULL) p++;
    return p == start ? NULL : p;
}

int relay_json_get_string(const char *json, const char *key, char *out, size_t size) {
    if (size == 0) return 0;
    out[0] = '\0';
    const char *p = json_ws(json);
    if (*p != '{') return 0;
    p = json_ws(p + 1);
    size_t key_size = strlen(key);
    while (*p == '"') {
        const char *name = p + 1, *end = json_skip_string(p);
        if (!end) return 0;
        int match = (size_t)(end - 1 - name) == key_size && memcmp(name, key, key_size) == 0;
        p = json_ws(end);
        if (*p != ':') return 0;
        p = json_ws(p + 1);
        if (match) {
            if (*p != '"' || !(end = json_skip_string(p))) return 0;
            size_t n = (size_t)(end - 1 - (p + 1));
            if (n + 1 > size || memchr(p + 1, '\\', n)) return 0;
            memcpy(out, p + 1, n);
            out[n] = '\0';
            return 1;
        }
        if (!(p = json_skip_value(p))) return 0;
        p = json_ws(p);
        if (*p != ',') return 0;
        p = json_ws(p + 1);
    }
    return 0;
}

static int get_uint(const msgpack_object *o, uint64_t *out) {
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return 0;
    *out = o->via.u64;
    return 1;
}

void relay_reply_error(const relay_reply *reply, relay_error *err) {
    if (!err) return;
    const msgpack_object *error = relay_map_get(&reply->body, "error");
    char name[64] = "internal";
    copy_str(relay_map_get(error, "code"), name, sizeof name);
    err->code = relay_code_from_name(name);
    snprintf(err->name, sizeof err->name, "%s", name);
    err->message[0] = '\0';
    copy_str(relay_map_get(error, "message"), err->message, sizeof err->message);
}

/* ------------------------------------------------------------------ frames */

typedef struct {
    char *data;
    size_t size;
} frame;

static void free_frames(frame *frames, size_t n) {
    for (size_t i = 0; i < n; i++) free(frames[i].data);
}

/* Receive one multipart message (the socket is readable). Returns the frame count. */
static int recv_frames(relay_client *c, frame *frames, size_t max, relay_error *err) {
    size_t n = 0;
    int more = 1;
    while (more) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, c->dealer, 0) < 0) {
            zmq_msg_close(&msg);
            free_frames(frames, n);
            return fail(err, RELAY_E_UNAVAILABLE, "receive failed: %s", zmq_strerror(errno));
        }
        more = zmq_msg_more(&msg);
        if (n < max) {
            size_t size = zmq_msg_size(&msg);
            frames[n].data = malloc(size + 1);
            if (!frames[n].data) abort();
            memcpy(frames[n].data, zmq_msg_data(&msg), size);
            frames[n].data[size] = '\0';
            frames[n].size = size;
        }
        n++;
        zmq_msg_close(&msg);
    }
    if (n > max) {
        free_frames(frames, max);
        return 0; /* more frames than any Relay message has: dropped */
    }
    return (int)n;
}

int relay_send_frames(relay_client *c, const relay_frame *frames, size_t count, relay_error *err) {
    for (size_t i = 0; i < count; i++) {
        int flags = i + 1 < count ? ZMQ_SNDMORE : 0;
        if (zmq_send(c->dealer, frames[i].data, frames[i].size, flags) < 0) {
            return fail(err, RELAY_E_UNAVAILABLE, "send failed: %s", zmq_strerror(errno));
        }
    }
    c->last_sent_ms = now_ms();
    return 0;
}

static int send_request(relay_client *c, const char *op, uint64_t rid, const char *fields,
                        size_t fields_size, size_t field_count, relay_error *err) {
    msgpack_sbuffer sbuf;
    msgpack_sbuffer_init(&sbuf);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (uint32_t)(field_count + 2));
    pack_str(&pk, "op");
    pack_str(&pk, op);
    pack_str(&pk, "rid");
    msgpack_pack_uint64(&pk, rid);
    if (fields_size) msgpack_sbuffer_write(&sbuf, fields, fields_size);
    relay_frame frames[2] = {{MAGIC, MAGIC_SIZE}, {sbuf.data, sbuf.size}};
    int rc = relay_send_frames(c, frames, 2, err);
    msgpack_sbuffer_destroy(&sbuf);
    return rc;
}

static void ping_if_quiet(relay_client *c) {
    if (now_ms() - c->last_sent_ms >= HEARTBEAT_MS) {
        /* rid 0: its reply is read by on_pong, wherever it arrives. */
        send_request(c, "ping", 0, NULL, 0, 0, NULL);
    }
}

/*
 * A ping's reply lists the subscriptions the router holds for this connection. One of
 * ours missing means the router restarted or ended the session (silent for 5 s): mark
 * it to be renewed by relay_next. Replies come in order, so every subscription whose
 * reply was read before this one was known to the router when it answered the ping.
 */
static void on_pong(relay_client *c, const relay_reply *reply) {
    const msgpack_object *subs = relay_map_get(&reply->result, "subs");
    if (!reply->ok || !subs || subs->type != MSGPACK_OBJECT_ARRAY) return;
    for (int i = 0; i < MAX_SUBS; i++) {
        if (!c->subs[i].used) continue;
        int held = 0;
        for (uint32_t k = 0; k < subs->via.array.size; k++) {
            const msgpack_object *o = &subs->via.array.ptr[k];
            if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == c->subs[i].id) held = 1;
        }
        if (!held) c->subs[i].lost = 1;
    }
}

/*
 * Read one incoming message within timeout_ms. A push is queued (returns 0); a reply
 * fills *reply (returns 1); nothing in time returns 0 with *timed_out set; -1 on error.
 * Frames that are neither are dropped (returns 0).
 */
static int read_incoming(relay_client *c, int timeout_ms, relay_reply *reply, int *timed_out,
                         relay_error *err) {
    zmq_pollitem_t item = {c->dealer, 0, ZMQ_POLLIN, 0};
    *timed_out = 0;
    int ready = zmq_poll(&item, 1, timeout_ms);
    if (ready < 0) {
        if (errno == EINTR) return 0;
        return fail(err, RELAY_E_UNAVAILABLE, "poll failed: %s", zmq_strerror(errno));
    }
    if (ready == 0) {
        *timed_out = 1;
        return 0;
    }
    frame frames[MAX_FRAMES];
    int n = recv_frames(c, frames, MAX_FRAMES, err);
    if (n < 0) return -1;
    if (n < 2 || n > 3 || frames[0].size != MAGIC_SIZE || memcmp(frames[0].data, MAGIC, 4) != 0) {
        free_frames(frames, (size_t)n);
        return 0;
    }
    msgpack_unpacked unpacked;
    msgpack_unpacked_init(&unpacked);
    size_t offset = 0;
    if (msgpack_unpack_next(&unpacked, frames[1].data, frames[1].size, &offset) !=
            MSGPACK_UNPACK_SUCCESS ||
        unpacked.data.type != MSGPACK_OBJECT_MAP) {
        msgpack_unpacked_destroy(&unpacked);
        free_frames(frames, (size_t)n);
        return 0;
    }
    const msgpack_object *header = &unpacked.data;
    if (relay_map_get(header, "push")) {
        queued *q = calloc(1, sizeof *q);
        if (!q) abort();
        int ok = n == 3 && get_uint(relay_map_get(header, "sub"), &q->message.sub) &&
                 copy_str(relay_map_get(header, "id"), q->message.id, sizeof q->message.id) &&
                 copy_str(relay_map_get(header, "endpoint"), q->message.endpoint,
                          sizeof q->message.endpoint);
        msgpack_unpacked_destroy(&unpacked);
        free(frames[0].data);
        free(frames[1].data);
        if (!ok) {
            if (n == 3) free(frames[2].data);
            free(q);
            return 0;
        }
        q->message.data = frames[2].data; /* NUL-terminated by recv_frames */
        q->message.size = frames[2].size;
        relay_json_get_string(q->message.data, "parentId", q->message.parent_id,
                              sizeof q->message.parent_id);
        if (c->tail) c->tail->next = q;
        else c->head = q;
        c->tail = q;
        return 0;
    }
    free(frames[0].data);
    if (n == 3) free(frames[2].data);
    memset(reply, 0, sizeof *reply);
    reply->unpacked_ = unpacked;
    reply->buffer_ = frames[1].data; /* the unpacked objects point into it */
    reply->body = unpacked.data;
    uint64_t rid = 0;
    get_uint(relay_map_get(header, "rid"), &rid);
    reply->rid = rid;
    const msgpack_object *ok = relay_map_get(header, "ok");
    reply->ok = ok && ok->type == MSGPACK_OBJECT_BOOLEAN && ok->via.boolean;
    const msgpack_object *result = relay_map_get(header, "result");
    if (result) reply->result = *result;
    else reply->result.type = MSGPACK_OBJECT_NIL;
    return 1;
}

int relay_recv_reply(relay_client *c, int timeout_ms, relay_reply *reply, relay_error *err) {
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - now_ms();
        int timed_out;
        int got = read_incoming(c, left > 0 ? (int)left : 0, reply, &timed_out, err);
        if (got != 0) return got < 0 ? -1 : 0;
        if (timed_out || now_ms() >= deadline) {
            return fail(err, RELAY_E_TIMEOUT, "no reply from the broker at %s within %g s",
                        c->address, timeout_ms / 1000.0);
        }
    }
}

/* ------------------------------------------------------------------ requests */

static int call(relay_client *c, const char *op, const char *fields, size_t fields_size,
                size_t field_count, int timeout_ms, relay_reply *reply, relay_error *err) {
    uint64_t rid = ++c->rid;
    if (send_request(c, op, rid, fields, fields_size, field_count, err) < 0) return -1;
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - now_ms();
        int timed_out;
        relay_reply got;
        int rc = read_incoming(c, left > 0 ? (int)left : 0, &got, &timed_out, err);
        if (rc < 0) return -1;
        if (rc == 1) {
            if (got.rid != rid) { /* a ping's reply, or a late one */
                if (got.rid == 0) on_pong(c, &got);
                relay_reply_destroy(&got);
                continue;
            }
            if (!got.ok) {
                relay_reply_error(&got, err);
                relay_reply_destroy(&got);
                return -1;
            }
            if (reply) *reply = got;
            else relay_reply_destroy(&got);
            return 0;
        }
        if (timed_out || now_ms() >= deadline) {
            return fail(err, RELAY_E_TIMEOUT, "no reply to '%s' from the broker at %s within %g s",
                        op, c->address, timeout_ms / 1000.0);
        }
    }
}

int relay_request(relay_client *c, const char *op, const char *fields, size_t fields_size,
                  size_t field_count, relay_reply *reply, relay_error *err) {
    return call(c, op, fields, fields_size, field_count, c->timeout_ms, reply, err);
}

int relay_router_address(const char *home, char *out, size_t size) {
    char path[4096];
    if (!home || !*home) home = getenv("RELAY_HOME");
    if (!home || !*home) home = "~/.dork/relay";
    if (home[0] == '~' && (home[1] == '/' || home[1] == '\0')) {
        const char *user = getenv("HOME");
        snprintf(path, sizeof path, "%s%s", user ? user : "", home + 1);
    } else {
        snprintf(path, sizeof path, "%s", home);
    }
    int n = snprintf(out, size, "ipc://%s/run/router.sock", path);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* The 40-character Z85 value of `name = "..."` in a ZeroMQ certificate file. */
static int read_cert_key(const char *file, const char *name, char out[41]) {
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    char line[512];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, name);
        const char *quote = at ? strchr(at, '"') : NULL;
        if (quote && strlen(quote + 1) > 40 && quote[41] == '"') {
            memcpy(out, quote + 1, 40);
            out[40] = '\0';
            found = 0;
        }
    }
    fclose(f);
    return found;
}

relay_client *relay_connect(const char *address, int timeout_ms, relay_error *err) {
    const char *key_file = getenv("RELAY_KEY_FILE");
    if (key_file && *key_file && strncmp(address, "tcp://", 6) == 0) {
        return relay_connect_curve(address, timeout_ms, key_file, getenv("RELAY_SERVER_KEY"), err);
    }
    return relay_connect_curve(address, timeout_ms, NULL, NULL, err);
}

relay_client *relay_connect_curve(const char *address, int timeout_ms, const char *key_file,
                                  const char *server_key, relay_error *err) {
    char public_key[41], secret_key[41], server[41];
    if (key_file) {
        if (read_cert_key(key_file, "public-key", public_key) < 0 ||
            read_cert_key(key_file, "secret-key", secret_key) < 0) {
            fail(err, RELAY_E_INVALID_MESSAGE, "cannot read a CURVE key pair from %s", key_file);
            return NULL;
        }
        FILE *probe = server_key ? fopen(server_key, "r") : NULL;
        if (probe) fclose(probe);
        if (server_key && !probe && strlen(server_key) == 40) {
            memcpy(server, server_key, 41);
        } else if (!server_key || read_cert_key(server_key, "public-key", server) < 0) {
            fail(err, RELAY_E_INVALID_MESSAGE, "cannot read the broker's public key from %s",
                 server_key ? server_key : "(none given: RELAY_SERVER_KEY)");
            return NULL;
        }
    }
    relay_client *c = calloc(1, sizeof *c);
    if (!c) abort();
    snprintf(c->address, sizeof c->address, "%s", address);
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : RELAY_DEFAULT_TIMEOUT_MS;
    c->ctx = zmq_ctx_new();
    c->dealer = zmq_socket(c->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(c->dealer, ZMQ_LINGER, &linger, sizeof linger);
    if (key_file) {
        zmq_setsockopt(c->dealer, ZMQ_CURVE_SERVERKEY, server, 41);
        zmq_setsockopt(c->dealer, ZMQ_CURVE_PUBLICKEY, public_key, 41);
        zmq_setsockopt(c->dealer, ZMQ_CURVE_SECRETKEY, secret_key, 41);
    }
    if (zmq_connect(c->dealer, address) < 0) {
        fail(err, RELAY_E_UNAVAILABLE, "cannot connect to %s: %s", address, zmq_strerror(errno));
        relay_close(c);
        return NULL;
    }
    msgpack_sbuffer sbuf;
    msgpack_sbuffer_init(&sbuf);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);
    pack_str(&pk, "client");
    pack_str(&pk, "relay-c/0.1");
    relay_reply reply;
    relay_error hello_err;
    int rc = call(c, "hello", sbuf.data, sbuf.size, 1, c->timeout_ms, &reply, &hello_err);
    msgpack_sbuffer_destroy(&sbuf);
    if (rc < 0) {
        if (hello_err.code == RELAY_E_TIMEOUT) {
            fail(err, RELAY_E_UNAVAILABLE,
                 "broker unavailable at %s: no answer within %g s (is `relay up` running for "
                 "this home?)",
                 address, c->timeout_ms / 1000.0);
        } else if (err) {
            *err = hello_err;
        }
        c->rid = 0; /* no bye */
        relay_close(c);
        return NULL;
    }
    copy_str(relay_map_get(&reply.result, "signals"), c->signals, sizeof c->signals);
    relay_reply_destroy(&reply);
    return c;
}

const char *relay_signals_address(const relay_client *c) { return c->signals; }

void relay_close(relay_client *c) {
    if (!c) return;
    if (c->rid > 0) call(c, "bye", NULL, 0, 0, 1000, NULL, NULL);
    while (c->head) {
        queued *q = c->head;
        c->head = q->next;
        relay_message_destroy(&q->message);
        free(q);
    }
    if (c->dealer) zmq_close(c->dealer);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c);
}

/* ------------------------------------------------------------------ operations */

typedef struct {
    msgpack_sbuffer sbuf;
    msgpack_packer pk;
    size_t count;
} fields;

static void fields_init(fields *f) {
    msgpack_sbuffer_init(&f->sbuf);
    msgpack_packer_init(&f->pk, &f->sbuf, msgpack_sbuffer_write);
    f->count = 0;
}

static void field_str(fields *f, const char *key, const char *value) {
    pack_str(&f->pk, key);
    pack_str(&f->pk, value);
    f->count++;
}

static void field_uint(fields *f, const char *key, uint64_t value) {
    pack_str(&f->pk, key);
    msgpack_pack_uint64(&f->pk, value);
    f->count++;
}

static int fields_call(relay_client *c, const char *op, fields *f, relay_reply *reply,
                       relay_error *err) {
    int rc = call(c, op, f->sbuf.data, f->sbuf.size, f->count, c->timeout_ms, reply, err);
    msgpack_sbuffer_destroy(&f->sbuf);
    return rc;
}

int relay_ping(relay_client *c, relay_error *err) {
    return call(c, "ping", NULL, 0, 0, c->timeout_ms, NULL, err);
}

int relay_register(relay_client *c, const char *subject, relay_error *err) {
    fields f;
    fields_init(&f);
    field_str(&f, "subject", subject);
    return fields_call(c, "register", &f, NULL, err);
}

int relay_publish(relay_client *c, const char *subject, const char *from, const char *payload,
                  size_t payload_size, relay_publish_result *out, relay_error *err) {
    fields f;
    fields_init(&f);
    field_str(&f, "subject", subject);
    field_str(&f, "from", from);
    pack_str(&f.pk, "payload");
    msgpack_sbuffer_write(&f.sbuf, payload, payload_size);
    f.count++;
    relay_reply reply;
    if (fields_call(c, "publish", &f, &reply, err) < 0) return -1;
    if (out) {
        memset(out, 0, sizeof *out);
        copy_str(relay_map_get(&reply.result, "messageId"), out->message_id, sizeof out->message_id);
        const msgpack_object *delivered = relay_map_get(&reply.result, "deliveredTo");
        if (delivered && delivered->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            out->delivered_to = (int64_t)delivered->via.u64;
        }
        const msgpack_object *rejected = relay_map_get(&reply.result, "rejected");
        if (rejected && rejected->type == MSGPACK_OBJECT_ARRAY) {
            out->rejected = rejected->via.array.size;
            if (out->rejected && rejected->via.array.ptr[0].type == MSGPACK_OBJECT_ARRAY &&
                rejected->via.array.ptr[0].via.array.size == 2) {
                char endpoint[64] = "", reason[32] = "";
                copy_str(&rejected->via.array.ptr[0].via.array.ptr[0], endpoint, sizeof endpoint);
                copy_str(&rejected->via.array.ptr[0].via.array.ptr[1], reason, sizeof reason);
                snprintf(out->first_rejection, sizeof out->first_rejection, "%s %s", endpoint,
                         reason);
            }
        }
    }
    relay_reply_destroy(&reply);
    return 0;
}

int relay_publish_text(relay_client *c, const char *subject, const char *from, const char *text,
                       relay_publish_result *out, relay_error *err) {
    msgpack_sbuffer sbuf;
    msgpack_sbuffer_init(&sbuf);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "content");
    pack_str(&pk, text);
    int rc = relay_publish(c, subject, from, sbuf.data, sbuf.size, out, err);
    msgpack_sbuffer_destroy(&sbuf);
    return rc;
}

static int subscribe(relay_client *c, const char *pattern, int credit, uint64_t *sub,
                     relay_error *err) {
    fields f;
    fields_init(&f);
    field_str(&f, "pattern", pattern);
    field_str(&f, "mode", "consume");
    if (credit > 0) field_uint(&f, "credit", (uint64_t)credit);
    relay_reply reply;
    if (fields_call(c, "subscribe", &f, &reply, err) < 0) return -1;
    uint64_t id = 0;
    int ok = get_uint(relay_map_get(&reply.result, "sub"), &id);
    relay_reply_destroy(&reply);
    if (!ok) return fail(err, RELAY_E_MALFORMED_FRAME, "subscribe reply without a sub id");
    *sub = id;
    return 0;
}

int relay_subscribe(relay_client *c, const char *pattern, int credit, uint64_t *sub,
                    relay_error *err) {
    uint64_t id;
    if (subscribe(c, pattern, credit, &id, err) < 0) return -1;
    for (int i = 0; i < MAX_SUBS; i++) {
        sub_entry *e = &c->subs[i];
        if (e->used || strlen(pattern) >= sizeof e->pattern) continue;
        memset(e, 0, sizeof *e);
        e->used = 1;
        e->first_id = e->id = id;
        e->credit = credit;
        strcpy(e->pattern, pattern);
        break;
    }
    if (sub) *sub = id;
    return 0;
}

static sub_entry *find_sub(relay_client *c, uint64_t sub) {
    for (int i = 0; i < MAX_SUBS; i++) {
        if (c->subs[i].used && (c->subs[i].first_id == sub || c->subs[i].id == sub)) {
            return &c->subs[i];
        }
    }
    return NULL;
}

int relay_unsubscribe(relay_client *c, uint64_t sub, relay_error *err) {
    sub_entry *e = find_sub(c, sub);
    if (e) {
        sub = e->id;
        e->used = 0;
    }
    fields f;
    fields_init(&f);
    field_uint(&f, "sub", sub);
    return fields_call(c, "unsubscribe", &f, NULL, err);
}

/* Subscribe again to what the router lost (see on_pong). */
static int renew_lost(relay_client *c, relay_error *err) {
    for (int i = 0; i < MAX_SUBS; i++) {
        sub_entry *e = &c->subs[i];
        if (!e->used || !e->lost) continue;
        e->lost = 0;
        if (subscribe(c, e->pattern, e->credit, &e->id, err) < 0) {
            e->used = 0;
            return -1;
        }
    }
    return 0;
}

int relay_next(relay_client *c, int timeout_ms, relay_message *message, relay_error *err) {
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        if (renew_lost(c, err) < 0) return -1;
        if (c->head) {
            queued *q = c->head;
            c->head = q->next;
            if (!c->head) c->tail = NULL;
            *message = q->message;
            free(q);
            return 1;
        }
        int64_t left = deadline - now_ms();
        if (left <= 0) return 0;
        ping_if_quiet(c); /* keep the session (and its subscriptions) alive */
        int timed_out;
        relay_reply reply;
        int wait = left < HEARTBEAT_MS ? (int)left : HEARTBEAT_MS;
        int rc = read_incoming(c, wait, &reply, &timed_out, err);
        if (rc < 0) return -1;
        if (rc == 1) { /* a ping's reply (or a late one) */
            if (reply.rid == 0) on_pong(c, &reply);
            relay_reply_destroy(&reply);
        }
    }
}

static int settle(relay_client *c, const char *op, const relay_message *m, const char *reason,
                  relay_error *err) {
    fields f;
    fields_init(&f);
    field_uint(&f, "sub", m->sub);
    field_str(&f, "id", m->id);
    field_str(&f, "endpoint", m->endpoint);
    if (reason) field_str(&f, "reason", reason);
    return fields_call(c, op, &f, NULL, err);
}

int relay_ack(relay_client *c, const relay_message *m, relay_error *err) {
    return settle(c, "ack", m, NULL, err);
}

int relay_nack(relay_client *c, const relay_message *m, const char *reason, relay_error *err) {
    return settle(c, "nack", m, reason ? reason : "rejected by consumer", err);
}
