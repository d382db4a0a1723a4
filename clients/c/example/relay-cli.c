/*
 * relay-cli: publish and consume from the command line with the C client.
 *
 *   relay-cli [--home DIR | --address ADDR] [--timeout MS] register SUBJECT
 *   relay-cli [...] publish SUBJECT TEXT --from SENDER
 *   relay-cli [...] consume PATTERN [--count N] [--wait MS] [--credit N] [--nack-if TEXT]
 *
 * publish sends the payload {"content": TEXT} and prints
 *   {"messageId": "...", "deliveredTo": N, "rejected": N}
 * consume prints {"ready": true, "sub": N}, then for each message, after acking it (or
 * nacking it when its envelope contains the --nack-if text),
 *   {"id": "...", "endpoint": "...", "settled": "ack"|"nack", "envelope": {...}}
 * and stops after --count messages, or when none came for --wait ms (default: forever).
 * Errors go to stderr as "relay-cli: <code>: <message>"; the exit status is 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay.h"

static int usage(void) {
    fprintf(stderr,
            "usage: relay-cli [--home DIR | --address ADDR] [--timeout MS] COMMAND ...\n"
            "  register SUBJECT\n"
            "  publish SUBJECT TEXT --from SENDER\n"
            "  consume PATTERN [--count N] [--wait MS] [--credit N] [--nack-if TEXT]\n");
    return 2;
}

static int report(const relay_error *err) {
    fprintf(stderr, "relay-cli: %s: %s\n", err->name, err->message);
    return 1;
}

int main(int argc, char **argv) {
    const char *home = NULL, *address = NULL, *from = NULL, *nack_if = NULL;
    long timeout_ms = RELAY_DEFAULT_TIMEOUT_MS, count = -1, wait_ms = -1, credit = 0;
    const char *args[3];
    int nargs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--home") == 0 && next) home = argv[++i];
        else if (strcmp(a, "--address") == 0 && next) address = argv[++i];
        else if (strcmp(a, "--timeout") == 0 && next) timeout_ms = strtol(argv[++i], NULL, 10);
        else if (strcmp(a, "--from") == 0 && next) from = argv[++i];
        else if (strcmp(a, "--count") == 0 && next) count = strtol(argv[++i], NULL, 10);
        else if (strcmp(a, "--wait") == 0 && next) wait_ms = strtol(argv[++i], NULL, 10);
        else if (strcmp(a, "--credit") == 0 && next) credit = strtol(argv[++i], NULL, 10);
        else if (strcmp(a, "--nack-if") == 0 && next) nack_if = argv[++i];
        else if (a[0] == '-' && a[1] == '-') return usage();
        else if (nargs < 3) args[nargs++] = a;
        else return usage();
    }
    if (nargs < 2) return usage();

    char router[4200];
    if (!address) {
        if (relay_router_address(home, router, sizeof router) < 0) {
            fprintf(stderr, "relay-cli: home path too long\n");
            return 1;
        }
        address = router;
    }
    relay_error err;
    relay_client *client = relay_connect(address, (int)timeout_ms, &err);
    if (!client) return report(&err);

    int status = 0;
    const char *command = args[0];
    if (strcmp(command, "register") == 0 && nargs == 2) {
        if (relay_register(client, args[1], &err) < 0) status = report(&err);
        else printf("{\"registered\": \"%s\"}\n", args[1]);
    } else if (strcmp(command, "publish") == 0 && nargs == 3 && from) {
        relay_publish_result result;
        if (relay_publish_text(client, args[1], from, args[2], &result, &err) < 0) {
            status = report(&err);
        } else {
            printf("{\"messageId\": \"%s\", \"deliveredTo\": %lld, \"rejected\": %zu}\n",
                   result.message_id, (long long)result.delivered_to, result.rejected);
        }
    } else if (strcmp(command, "consume") == 0 && nargs == 2) {
        uint64_t sub;
        if (relay_subscribe(client, args[1], (int)credit, &sub, &err) < 0) {
            status = report(&err);
        } else {
            printf("{\"ready\": true, \"sub\": %llu}\n", (unsigned long long)sub);
            fflush(stdout);
            for (long seen = 0; count < 0 || seen < count; seen++) {
                relay_message message;
                int got = relay_next(client, wait_ms < 0 ? 1 << 30 : (int)wait_ms, &message, &err);
                if (got < 0) {
                    status = report(&err);
                    break;
                }
                if (got == 0) break; /* nothing for --wait ms */
                int nack = nack_if && strstr(message.data, nack_if) != NULL;
                int rc = nack ? relay_nack(client, &message, "nack-if matched", &err)
                              : relay_ack(client, &message, &err);
                if (rc < 0) {
                    relay_message_destroy(&message);
                    status = report(&err);
                    break;
                }
                printf("{\"id\": \"%s\", \"endpoint\": \"%s\", \"settled\": \"%s\", \"envelope\": %s}\n",
                       message.id, message.endpoint, nack ? "nack" : "ack", message.data);
                fflush(stdout);
                relay_message_destroy(&message);
            }
        }
    } else {
        status = usage();
    }
    relay_close(client);
    return status;
}
