"use strict";
/** Relay client for Node.js: see README.md and docs/protocol.md. */
const client = require("./client");
const errors = require("./errors");
const subjects = require("./subjects");
const wire = require("./wire");

module.exports = {
  connect: client.connect,
  routerAddress: client.routerAddress,
  Client: client.Client,
  Subscription: client.Subscription,
  Message: client.Message,
  ...errors,
  subjects,
  wire,
};
