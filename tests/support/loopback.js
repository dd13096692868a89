// Preloaded with `node -r tests/support/loopback.js` in front of the kinesalite and dynalite CLIs.
//
// Why: kinesalite's CLI has no --host option and calls server.listen(port, cb), which binds every
// interface. Tests must only be reachable on 127.0.0.1, so this rewrites a missing or wildcard
// host ('', 0.0.0.0, ::) in net.Server.prototype.listen to 127.0.0.1 before the real listen runs.
'use strict'

var net = require('net')

var LOOPBACK = '127.0.0.1'
var WILDCARDS = { '': true, '0.0.0.0': true, '::': true, '::0': true }
var originalListen = net.Server.prototype.listen

function isWildcard(host) {
  return host === undefined || host === null || WILDCARDS[host] === true
}

net.Server.prototype.listen = function () {
  var args = Array.prototype.slice.call(arguments)
  var first = args[0]
  if (first !== null && typeof first === 'object' && !Array.isArray(first)) {
    // listen(options[, cb]): only TCP listens (with a port, not a unix path) are rewritten.
    if (first.path === undefined && isWildcard(first.host)) {
      args[0] = Object.assign({}, first, { host: LOOPBACK })
    }
  } else if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
    // listen(port[, host][, backlog][, cb])
    if (typeof args[1] === 'string' || args[1] === undefined || args[1] === null) {
      if (isWildcard(args[1])) {
        if (args.length < 2) args.push(LOOPBACK)
        else args[1] = LOOPBACK
      }
    } else {
      // listen(port, backlog?, cb) / listen(port, cb): insert the host after the port.
      args.splice(1, 0, LOOPBACK)
    }
  }
  return originalListen.apply(this, args)
}

// Orphan guard: the test session stops this server by its pid, but if the session itself is
// killed (SIGKILL, OOM) nobody would. When the parent goes away the process is re-parented, so
// exit then. unref() keeps the timer from holding the event loop open on its own.
var parentPid = process.ppid
setInterval(function () {
  if (process.ppid !== parentPid) process.exit(0)
}, 500).unref()
