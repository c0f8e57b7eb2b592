// The benchmark's upstream: answers every request at once with a small JSON
// body, like a fast payments API. Prints its port on stdout.
import { createServer } from 'node:http';

let n = 0;
const server = createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    const body = `{"id":"ch_${++n}","object":"charge"}`;
    res.writeHead(201, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: server.address().port })));
