// Test shim, loaded with `node --require` in front of the real ScreenTinker server:
// Socket.IO's ping interval and timeout from the environment, so liveness tests take
// seconds where ScreenTinker's defaults (25 s / 20 s) take minutes. Nothing else of
// the server changes; without the variables this does nothing.
'use strict';
const interval = Number(process.env.EDGE_TEST_PING_INTERVAL_MS || 0);
const timeout = Number(process.env.EDGE_TEST_PING_TIMEOUT_MS || 0);
if (interval > 0 || timeout > 0) {
  const sio = require(require.resolve('socket.io', { paths: [process.cwd()] }));
  const Base = sio.Server;
  class Server extends Base {
    constructor(srv, opts = {}) {
      super(srv, { ...opts,
        ...(interval > 0 ? { pingInterval: interval } : {}),
        ...(timeout > 0 ? { pingTimeout: timeout } : {}) });
    }
  }
  sio.Server = Server;
}
