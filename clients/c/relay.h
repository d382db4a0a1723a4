/*
 * relay.h: a minimal C client for the Relay message bus (docs/protocol.md).
 *
 * One relay_client is one DEALER connection to the router: requests are answered
 * synchronously (one at a time, with a deadline); messages pushed to a subscription
 * while a request waits are queued and returned by relay_next(). Not thread-safe: use
 * one client per thread.
 *
 * Conventions: functions returning int give 0 on success and -1 on failure, with
 * *err filled (err may be NULL). Every error reply of the broker becomes a relay_error
 * whose `code` is the typed code and `name` the protocol's string ("invalid_subject").
 * Client-side codes: RELAY_E_TIMEOUT (no reply within the deadline) and
 * RELAY_E_UNAVAILABLE (no broker answered hello).
 *
 * Sessions: the router ends a connection silent for 5 s: its subscriptions end, and the
 * messages it holds can no longer be acknowledged through it (they stay claimed, listed
 * by `pending`). relay_next() pings every second while it waits; a consumer that works
 * longer than 5 s on one message should call relay_ping() now and then. When a ping's
 * reply shows that the router lost a subscription (it restarted, or the session timed
 * out), relay_next() subscribes again: messages then carry the new subscription id in
 * `sub`, and relay_unsubscribe() accepts the old id or the new one.
 */
#ifndef RELAY_H
#define RELAY_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RELAY_PROTOCOL_VERSION 1
#define RELAY_DEFAULT_TIMEOUT_MS 10000

typedef enum {
    RELAY_OK = 0,
    RELAY_E_MALFORMED_FRAME,
    RELAY_E_UNSUPPORTED_VERSION,
    RELAY_E_UNKNOWN_OPERATION,
    RELAY_E_INVALID_MESSAGE,
    RELAY_E_INVALID_SUBJECT,
    RELAY_E_PAYLOAD_TOO_LARGE,
    RELAY_E_LIMIT_EXCEEDED,
    RELAY_E_ENDPOINT_NOT_FOUND,
    RELAY_E_MESSAGE_NOT_FOUND,
    RELAY_E_ALREADY_CLAIMED,
    RELAY_E_INVALID_STATE,
    RELAY_E_ACCESS_DENIED,
    RELAY_E_INVALID_CONFIG,
    RELAY_E_STORAGE_ERROR,
    RELAY_E_UNAVAILABLE,
    RELAY_E_TIMEOUT,
    RELAY_E_INTERNAL,
    RELAY_E_SENDER_NOT_ALLOWED,
    RELAY_E_NOT_AUTHORIZED,
    RELAY_E_TTL_EXPIRED, /* a requeue refused past its TTL: a refinement of INVALID_STATE */
    RELAY_E_OTHER /* a code this client does not know: relay_error.name has it */
} relay_code;

typedef struct {
    relay_code code;
    char name[64];     /* the protocol's code, e.g. "invalid_subject" */
    char message[512]; /* for people */
} relay_error;

/* The code's protocol name ("invalid_subject"); "ok" for RELAY_OK. */
const char *relay_code_name(relay_code code);
/* The typed code of a protocol name; RELAY_E_OTHER when unknown. */
relay_code relay_code_from_name(const char *name);

typedef struct relay_client relay_client;

/* A reply. `body` is the whole reply map, `result` its result (nil on errors). */
typedef struct {
    uint64_t rid;
    int ok;
    msgpack_object body;
    msgpack_object result;
    /* private */
    msgpack_unpacked unpacked_;
    char *buffer_;
} relay_reply;

void relay_reply_destroy(relay_reply *reply);
/* Fill *err from an error reply (code, name, message). */
void relay_reply_error(const relay_reply *reply, relay_error *err);

/* A message pushed to a subscription: `data` is the envelope, UTF-8 JSON (NUL-terminated). */
typedef struct {
    uint64_t sub;
    char id[40];
    char endpoint[80];
    char *data;
    size_t size;
    char parent_id[40]; /* a reply's parentId: the id of the message it answers; "" if none */
} relay_message;

void relay_message_destroy(relay_message *message);

typedef struct {
    char message_id[40];
    int64_t delivered_to;
    size_t rejected;           /* number of [endpoint, reason] pairs */
    char first_rejection[96];  /* "endpoint reason" of the first one, or "" */
} relay_publish_result;

/* "ipc://<home>/run/router.sock"; home NULL means $RELAY_HOME or ~/.dork/relay. */
int relay_router_address(const char *home, char *out, size_t size);

/* Connect and say hello. NULL with RELAY_E_UNAVAILABLE when no broker answers in time.
   On tcp:// with $RELAY_KEY_FILE set, this is relay_connect_curve(address, timeout_ms,
   $RELAY_KEY_FILE, $RELAY_SERVER_KEY, err). */
relay_client *relay_connect(const char *address, int timeout_ms, relay_error *err);
/* The same over CURVE (tcp:// brokers require it, docs/security.md): key_file is this
   client's ZeroMQ certificate "NAME.key_secret"; server_key the broker's public key as
   40 Z85 characters or the path of its "server.key". RELAY_E_INVALID_MESSAGE for an
   unreadable key; a broker that refuses the key answers nothing: RELAY_E_UNAVAILABLE. */
relay_client *relay_connect_curve(const char *address, int timeout_ms, const char *key_file,
                                  const char *server_key, relay_error *err);
/* Say bye (briefly) and close. Messages held unacknowledged stay claimed. */
void relay_close(relay_client *client);
/* The signals address the hello reply named. */
const char *relay_signals_address(const relay_client *client);

/*
 * Any operation. `fields` holds `field_count` msgpack key/value pairs packed one after
 * the other (msgpack_pack_str + a value, for each); the client adds op and rid. On
 * success *reply holds the result: relay_reply_destroy() it. An error reply gives -1
 * and *err, and nothing to destroy.
 */
int relay_request(relay_client *client, const char *op, const char *fields, size_t fields_size,
                  size_t field_count, relay_reply *reply, relay_error *err);

int relay_ping(relay_client *client, relay_error *err);
int relay_register(relay_client *client, const char *subject, relay_error *err);

/* Publish a payload already packed in msgpack (any value JSON can hold). */
int relay_publish(relay_client *client, const char *subject, const char *from,
                  const char *payload, size_t payload_size, relay_publish_result *out,
                  relay_error *err);
/* Publish the standard payload {"content": text}. */
int relay_publish_text(relay_client *client, const char *subject, const char *from,
                       const char *text, relay_publish_result *out, relay_error *err);

/* Consume the messages of every endpoint matching pattern; credit 0 = the broker's default. */
int relay_subscribe(relay_client *client, const char *pattern, int credit, uint64_t *sub,
                    relay_error *err);
int relay_unsubscribe(relay_client *client, uint64_t sub, relay_error *err);

/* The next pushed message: 1 and *message (destroy it), 0 on timeout, -1 on error. */
int relay_next(relay_client *client, int timeout_ms, relay_message *message, relay_error *err);
int relay_ack(relay_client *client, const relay_message *message, relay_error *err);
int relay_nack(relay_client *client, const relay_message *message, const char *reason,
               relay_error *err);

/* Raw frames, for conformance tests: send any frames; read the next reply of any rid. */
typedef struct {
    const void *data;
    size_t size;
} relay_frame;
int relay_send_frames(relay_client *client, const relay_frame *frames, size_t count,
                      relay_error *err);
int relay_recv_reply(relay_client *client, int timeout_ms, relay_reply *reply, relay_error *err);

/* The value of `key` in a msgpack map, or NULL. */
const msgpack_object *relay_map_get(const msgpack_object *map, const char *key);

/* The string value of a top-level `key` of a JSON object (an envelope: "parentId",
   "replyTo", "from", ...), copied into out: 1, or 0 with out "" when the key is absent,
   its value is not a string, holds a backslash escape (undecoded here: ids and subjects
   never have one) or does not fit in size bytes with its NUL. Nested objects (the
   payload) are skipped, not searched. */
int relay_json_get_string(const char *json, const char *key, char *out, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* RELAY_H */
