"use strict";
/**
 * The subject grammar (docs/protocol.md, "Subjects"): dot-separated tokens of
 * [A-Za-z0-9_-]; patterns may use `*` (one token) and `>` (one or more tokens, last
 * only). At most 256 bytes and 16 tokens. NATS matching.
 */
const { InvalidSubjectError } = require("./errors");

const MAX_SUBJECT_BYTES = 256;
const MAX_TOKENS = 16;
const TOKEN = /^[A-Za-z0-9_-]+$/;

/** The first problem with `subject`, or null when it is valid. */
function problem(subject, wildcards) {
  if (typeof subject !== "string") return `subject must be a string, not ${typeof subject}`;
  if (subject === "") return "subject is empty";
  const size = Buffer.byteLength(subject, "utf8");
  if (size > MAX_SUBJECT_BYTES) {
    return `subject is ${size} bytes, over the ${MAX_SUBJECT_BYTES}-byte limit`;
  }
  const tokens = subject.split(".");
  if (tokens.length > MAX_TOKENS) {
    return `invalid subject '${subject}': ${tokens.length} tokens, over the limit of ${MAX_TOKENS}`;
  }
  for (let i = 0; i < tokens.length; i++) {
    const token = tokens[i];
    const where = `invalid subject '${subject}': token ${i + 1}`;
    if (token === "") return `${where} is empty`;
    if (token === "*" || token === ">") {
      if (!wildcards) return `${where} is a wildcard; a concrete subject is required`;
      if (token === ">" && i !== tokens.length - 1) return `${where}: '>' must be the last token`;
      continue;
    }
    if (!TOKEN.test(token)) return `${where} (${JSON.stringify(token)}) is not [A-Za-z0-9_-]+`;
  }
  return null;
}

/**
 * Return `subject` if valid, else throw InvalidSubjectError.
 * @param {string} subject @param {{wildcards?: boolean}} [options]
 */
function validate(subject, { wildcards = false } = {}) {
  const found = problem(subject, wildcards);
  if (found) throw new InvalidSubjectError(found);
  return subject;
}

/** Whether `validate` would accept `subject`. */
function isValid(subject, { wildcards = false } = {}) {
  return problem(subject, wildcards) === null;
}

/** Whether the concrete `subject` matches `pattern`. */
function matches(subject, pattern) {
  validate(subject);
  validate(pattern, { wildcards: true });
  const s = subject.split(".");
  const p = pattern.split(".");
  for (let i = 0; i < p.length; i++) {
    if (p[i] === ">") return s.length > i;
    if (i >= s.length || (p[i] !== "*" && p[i] !== s[i])) return false;
  }
  return s.length === p.length;
}

/** The part of `pattern` before its first wildcard: the ZeroMQ SUB prefix for signals. */
function literalPrefix(pattern) {
  const tokens = validate(pattern, { wildcards: true }).split(".");
  const i = tokens.findIndex((t) => t === "*" || t === ">");
  return i < 0 ? pattern : tokens.slice(0, i).map((t) => `${t}.`).join("");
}

/** The endpoint's mailbox name: the first 12 hex characters of sha256(subject). */
function endpointHash(subject) {
  const { createHash } = require("node:crypto");
  return createHash("sha256").update(validate(subject), "utf8").digest("hex").slice(0, 12);
}

/** The first token of every reply inbox (docs/protocol.md, "Requests and replies"). */
const INBOX = "_INBOX";

/** The reply inbox of one client requesting as `sender`: `_INBOX.<sender>.<nonce>`. */
function replyInbox(sender, nonce) {
  return validate(`${INBOX}.${validate(sender)}.${nonce}`);
}

module.exports = {
  MAX_SUBJECT_BYTES, MAX_TOKENS, INBOX, validate, isValid, matches, literalPrefix, endpointHash, replyInbox,
};
