"use strict";
/**
 * Relay's error taxonomy: one class per stable code (docs/protocol.md, "Errors").
 *
 * Every error reply `{code, message}` becomes an instance of the class for its code,
 * so callers can write `err instanceof InvalidSubjectError` or `err.code ===
 * "invalid_subject"`. A code this client does not know still gives a RelayError that
 * carries it. Client-side codes: `timeout` (no reply within the deadline) and
 * `unavailable` (no broker answered hello).
 */

class RelayError extends Error {
  /** @param {string} message @param {string} [code] */
  constructor(message, code) {
    super(message);
    this.name = new.target.name;
    this.code = code || new.target.code || "internal";
  }
}
RelayError.code = "internal";

/** Build a subclass of `base` whose instances carry `code`. */
function define(name, code, base = RelayError) {
  const cls = {
    [name]: class extends base {
      constructor(message, overrideCode) {
        super(message, overrideCode || code);
      }
    },
  }[name];
  cls.code = code;
  return cls;
}

const MalformedFrameError = define("MalformedFrameError", "malformed_frame");
const UnsupportedVersionError = define("UnsupportedVersionError", "unsupported_version");
const UnknownOperationError = define("UnknownOperationError", "unknown_operation");
const InvalidMessageError = define("InvalidMessageError", "invalid_message");
const InvalidSubjectError = define("InvalidSubjectError", "invalid_subject");
const PayloadTooLargeError = define("PayloadTooLargeError", "payload_too_large");
const LimitExceededError = define("LimitExceededError", "limit_exceeded");
const NotFoundError = define("NotFoundError", "not_found");
const EndpointNotFoundError = define("EndpointNotFoundError", "endpoint_not_found", NotFoundError);
const MessageNotFoundError = define("MessageNotFoundError", "message_not_found", NotFoundError);
const AlreadyClaimedError = define("AlreadyClaimedError", "already_claimed");
const InvalidStateError = define("InvalidStateError", "invalid_state");
/** A dead letter to requeue is past its TTL: requeued, it would die again. */
const TtlExpiredError = define("TtlExpiredError", "ttl_expired", InvalidStateError);
const AccessDeniedError = define("AccessDeniedError", "access_denied");
const SenderNotAllowedError = define("SenderNotAllowedError", "sender_not_allowed", AccessDeniedError);
const NotAuthorizedError = define("NotAuthorizedError", "not_authorized", AccessDeniedError);
const InvalidConfigError = define("InvalidConfigError", "invalid_config");
const StorageError = define("StorageError", "storage_error");
const UnavailableError = define("UnavailableError", "unavailable");
const TimeoutError = define("TimeoutError", "timeout", UnavailableError);
const InternalError = define("InternalError", "internal");

const CLASSES = [
  MalformedFrameError, UnsupportedVersionError, UnknownOperationError, InvalidMessageError,
  InvalidSubjectError, PayloadTooLargeError, LimitExceededError, NotFoundError,
  EndpointNotFoundError, MessageNotFoundError, AlreadyClaimedError, InvalidStateError,
  TtlExpiredError, AccessDeniedError, SenderNotAllowedError, NotAuthorizedError, InvalidConfigError, StorageError,
  UnavailableError, TimeoutError, InternalError,
];

/** @type {Record<string, typeof RelayError>} code -> class */
const ERROR_CLASSES = Object.fromEntries(CLASSES.map((cls) => [cls.code, cls]));

/**
 * The typed error for a reply's `error` map (`{code, message}`).
 * @param {{code?: unknown, message?: unknown} | undefined | null} error
 * @returns {RelayError}
 */
function errorFromWire(error) {
  const code = error && typeof error.code === "string" ? error.code : "internal";
  const message = error && error.message != null ? String(error.message) : "";
  const cls = ERROR_CLASSES[code];
  return cls ? new cls(message) : new RelayError(message, code);
}

module.exports = {
  RelayError,
  ERROR_CLASSES,
  errorFromWire,
  ...Object.fromEntries(CLASSES.map((cls) => [cls.name, cls])),
};
