/*
 * test_client: the C client's own tests.
 *
 *   test_client                    tests that need no broker
 *   test_client ROUTER_ADDRESS     also the tests against a running broker
 *
 * Prints "ok"/"not ok" per check and "N passed, N failed"; exits 1 on any failure.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "relay.h"

static int passed, failed;

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (cond) {                                        \
            passed++;                                      \
        } else {                                           \
            failed++;                                      \
            printf("not ok - %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                           \
            printf("\n");                                  \
        }                                                  \
    } while (0)

static void test_codes(void) {
    const char *names[] = {"malformed_frame", "unsupported_version", "unknown_operation",
                           "invalid_message", "invalid_subject", "payload_too_large",
                           "limit_exceeded", "endpoint_not_found", "message_not_found",
                           "already_claimed", "invalid_state", "access_denied", "invalid_config",
                           "storage_error", "unavailable", "timeout", "internal",
                           "sender_not_allowed", "not_authorized", "ttl_expired"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        relay_code code = relay_code_from_name(names[i]);
        CHECK(code != RELAY_E_OTHER && code != RELAY_OK, "no code for %s", names[i]);
        CHECK(strcmp(relay_code_name(code), names[i]) == 0, "round trip of %s", names[i]);
    }
    CHECK(relay_code_from_name("brand_new") == RELAY_E_OTHER, "unknown code");
    char address[256];
    CHECK(relay_router_address("/x/y", address, sizeof address) == 0 &&
              strcmp(address, "ipc:///x/y/run/router.sock") == 0,
          "router address: %s", address);
}

static void test_json_get_string(void) {
    char out[40];
    const char *reply =
        "{\"id\": \"01JDQ3ZV9R6Q4W1T3M5N7P8K2F\", \"payload\": {\"parentId\": \"nested\", "
        "\"a\": [1, \"]}\\\"\", {\"b\": null}]}, \"n\": -1.5e3, \"t\": true,\n "
        "\"parentId\" : \"01JDQ3ZV9R6Q4W1T3M5N7P8K2A\"}";
    CHECK(relay_json_get_string(reply, "parentId", out, sizeof out) == 1 &&
              strcmp(out, "01JDQ3ZV9R6Q4W1T3M5N7P8K2A") == 0,
          "the top-level parentId, not the payload's: %s", out);
    CHECK(relay_json_get_string(reply, "id", out, sizeof out) == 1 &&
              strcmp(out, "01JDQ3ZV9R6Q4W1T3M5N7P8K2F") == 0,
          "id: %s", out);
    CHECK(relay_json_get_string(reply, "n", out, sizeof out) == 0 && out[0] == '\0',
          "a number is not a string");
    CHECK(relay_json_get_string("{\"id\": \"x\"}", "parentId", out, sizeof out) == 0 &&
              out[0] == '\0',
          "absent");
    CHECK(relay_json_get_string("{\"parentId\": \"0123456789\"}", "parentId", out, 8) == 0,
          "too long for the buffer");
    CHECK(relay_json_get_string("{\"parentId\": \"unterminated", "parentId", out, sizeof out) == 0,
          "malformed");
    CHECK(relay_json_get_string("[\"parentId\", \"x\"]", "parentId", out, sizeof out) == 0,
          "not an object");
}

static void test_no_broker(void) {
    char address[128];
    snprintf(address, sizeof address, "ipc:///tmp/relay-c-nobody-%d/run/router.sock", (int)getpid());
    relay_error err;
    relay_client *client = relay_connect(address, 300, &err);
    CHECK(client == NULL, "connected to nobody");
    CHECK(err.code == RELAY_E_UNAVAILABLE && strcmp(err.name, "unavailable") == 0, "code %s", err.name);
    CHECK(strstr(err.message, "broker unavailable at ipc:///tmp/relay-c-nobody-") != NULL &&
              strstr(err.message, "no answer within 0.3 s") != NULL,
          "message: %s", err.message); /* it names the deadline that fired: no stopwatch */
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void pack_str(msgpack_packer *pk, const char *text) {
    msgpack_pack_str(pk, strlen(text));
    msgpack_pack_str_body(pk, text, strlen(text));
}

/* A dead letter past its TTL: its requeue is refused with RELAY_E_TTL_EXPIRED (a
   refinement of invalid_state), not the "other" code. */
static void test_requeue_past_its_ttl(relay_client *client, const char *subject) {
    relay_error err;
    int64_t ttl = now_ms() + 2000;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_str(&pk, "subject");
    pack_str(&pk, subject);
    pack_str(&pk, "from");
    pack_str(&pk, "relay.c.sender");
    pack_str(&pk, "payload");
    pack_str(&pk, "short-lived");
    pack_str(&pk, "budget");
    msgpack_pack_map(&pk, 5);
    pack_str(&pk, "hopCount");
    msgpack_pack_int(&pk, 0);
    pack_str(&pk, "maxHops");
    msgpack_pack_int(&pk, 5);
    pack_str(&pk, "ancestorChain");
    msgpack_pack_array(&pk, 0);
    pack_str(&pk, "ttl");
    msgpack_pack_int64(&pk, ttl);
    pack_str(&pk, "callBudgetRemaining");
    msgpack_pack_int(&pk, 10);
    relay_reply published;
    int rc = relay_request(client, "publish", sb.data, sb.size, 4, &published, &err);
    msgpack_sbuffer_destroy(&sb);
    CHECK(rc == 0, "publish with a short TTL: %s", err.message);
    if (rc != 0) return;
    relay_reply_destroy(&published);

    uint64_t sub;
    relay_message m;
    CHECK(relay_subscribe(client, subject, 0, &sub, &err) == 0, "subscribe: %s", err.message);
    CHECK(relay_next(client, 5000, &m, &err) == 1, "the short-lived message");
    CHECK(relay_nack(client, &m, "too late", &err) == 0, "nack: %s", err.message);
    CHECK(relay_unsubscribe(client, sub, &err) == 0, "unsubscribe");
    relay_message dummy;
    while (now_ms() <= ttl + 50) relay_next(client, 100, &dummy, &err); /* the TTL passes */

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_str(&pk, "id");
    pack_str(&pk, m.id);
    rc = relay_request(client, "requeue_dead_letters", sb.data, sb.size, 1, NULL, &err);
    msgpack_sbuffer_destroy(&sb);
    CHECK(rc < 0 && err.code == RELAY_E_TTL_EXPIRED && strcmp(err.name, "ttl_expired") == 0,
          "requeue past its TTL: %s (%d) %s", err.name, err.code, err.message);
    relay_message_destroy(&m);
}

static void test_broker(const char *address) {
    relay_error err;
    relay_client *client = relay_connect(address, 10000, &err);
    CHECK(client != NULL, "connect: %s", client ? "" : err.message);
    if (!client) return;
    char subject[64];
    snprintf(subject, sizeof subject, "relay.c.t%d.backend", (int)getpid());
    CHECK(relay_ping(client, &err) == 0, "ping");
    CHECK(relay_register(client, subject, &err) == 0, "register: %s", err.message);

    /* typed errors */
    CHECK(relay_register(client, "relay..c", &err) < 0 && err.code == RELAY_E_INVALID_SUBJECT,
          "register of a bad subject: %s", err.name);
    CHECK(relay_request(client, "teleport", NULL, 0, 0, NULL, &err) < 0 &&
              err.code == RELAY_E_UNKNOWN_OPERATION && strstr(err.message, "teleport"),
          "unknown op: %s %s", err.name, err.message);
    uint64_t sub;
    CHECK(relay_subscribe(client, "relay.c.>", 5000, &sub, &err) < 0 &&
              err.code == RELAY_E_LIMIT_EXCEEDED,
          "credit 5000: %s", err.name);
    CHECK(relay_ping(client, &err) == 0, "usable after errors");

    /* publish, consume, ack, nack */
    relay_publish_result first, second;
    CHECK(relay_publish_text(client, subject, "relay.c.sender", "one", &first, &err) == 0 &&
              first.delivered_to == 1 && first.rejected == 0 && strlen(first.message_id) == 26,
          "publish one: %s", err.message);
    CHECK(relay_publish_text(client, subject, "relay.c.sender", "two", &second, &err) == 0,
          "publish two");
    relay_publish_result lost;
    CHECK(relay_publish_text(client, "relay.c.nobody", "relay.c.sender", "x", &lost, &err) == 0 &&
              lost.delivered_to == 0 && lost.rejected == 1 &&
              strcmp(lost.first_rejection, "* no_match") == 0,
          "publish to nobody: %s", lost.first_rejection);
    CHECK(relay_subscribe(client, subject, 0, &sub, &err) == 0 && sub > 0, "subscribe");
    relay_message m1, m2, m3;
    CHECK(relay_next(client, 5000, &m1, &err) == 1 && strcmp(m1.id, first.message_id) == 0 &&
              strstr(m1.data, "\"content\":\"one\"") != NULL && m1.sub == sub,
          "first message");
    CHECK(relay_ack(client, &m1, &err) == 0, "ack: %s", err.message);
    CHECK(relay_ack(client, &m1, &err) < 0 && err.code == RELAY_E_INVALID_STATE, "ack twice: %s", err.name);
    CHECK(relay_next(client, 5000, &m2, &err) == 1 && strcmp(m2.id, second.message_id) == 0,
          "second message");
    CHECK(relay_nack(client, &m2, "no thanks", &err) == 0, "nack: %s", err.message);
    CHECK(m1.parent_id[0] == '\0', "a message that answers nothing has no parent_id");

    /* a reply names the message it answers: parentId, in relay_message.parent_id */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    const char *kv[] = {"subject", subject, "from", "relay.c.sender", "payload", "re: one",
                        "parentId", first.message_id};
    for (size_t i = 0; i < 8; i++) {
        msgpack_pack_str(&pk, strlen(kv[i]));
        msgpack_pack_str_body(&pk, kv[i], strlen(kv[i]));
    }
    relay_reply published;
    CHECK(relay_request(client, "publish", sb.data, sb.size, 4, &published, &err) == 0,
          "publish a reply: %s", err.message);
    relay_reply_destroy(&published);
    msgpack_sbuffer_destroy(&sb);
    CHECK(relay_next(client, 5000, &m3, &err) == 1 &&
              strcmp(m3.parent_id, first.message_id) == 0,
          "the reply's parent_id: %s", m3.parent_id);
    CHECK(relay_ack(client, &m3, &err) == 0, "ack the reply");
    relay_message_destroy(&m3);

    CHECK(relay_next(client, 200, &m3, &err) == 0, "nothing more");
    relay_message_destroy(&m1);
    relay_message_destroy(&m2);

    /* the subscription outlives 6 s of silence: relay_next pings */
    relay_publish_result late;
    CHECK(relay_next(client, 6000, &m3, &err) == 0, "idle 6 s");
    relay_client *other = relay_connect(address, 10000, &err);
    CHECK(other && relay_publish_text(other, subject, "relay.c.sender", "late", &late, &err) == 0,
          "publish late");
    relay_close(other);
    CHECK(relay_next(client, 5000, &m3, &err) == 1 && strcmp(m3.id, late.message_id) == 0,
          "late message after 6 s");
    CHECK(relay_ack(client, &m3, &err) == 0, "ack late");
    relay_message_destroy(&m3);

    /* silent for 6 s (no relay_next, no ping): the router ends the session and its
       subscription; the next relay_next finds it missing from a ping's reply and
       subscribes again */
    sleep(6);
    other = relay_connect(address, 10000, &err);
    CHECK(other && relay_publish_text(other, subject, "relay.c.sender", "renewed", &late, &err) == 0,
          "publish after the session ended");
    relay_close(other);
    CHECK(relay_next(client, 5000, &m3, &err) == 1 && strcmp(m3.id, late.message_id) == 0,
          "message to the renewed subscription: %s", err.message);
    CHECK(m3.sub != sub, "the renewed subscription has a new id");
    CHECK(relay_ack(client, &m3, &err) == 0, "ack on the renewed subscription");
    relay_message_destroy(&m3);
    CHECK(relay_unsubscribe(client, sub, &err) == 0, "unsubscribe by the first id");
    CHECK(relay_unsubscribe(client, sub, &err) < 0 && err.code == RELAY_E_INVALID_STATE, "unsubscribe twice");
    test_requeue_past_its_ttl(client, subject);
    relay_close(client);
}

int main(int argc, char **argv) {
    test_codes();
    test_json_get_string();
    test_no_broker();
    if (argc > 1) test_broker(argv[1]);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
