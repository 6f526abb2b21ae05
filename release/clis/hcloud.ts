import type { IncomingMessage, ServerResponse } from 'node:http';
import type { CliCase } from './cli-case.js';

/**
 * Hetzner Cloud's CLI (Debian's hcloud-cli, Go) in TLS mode: `HCLOUD_TOKEN` holds the
 * placeholder; the proxy injects the real token as a Bearer header. hcloud reads the
 * token from the environment without checking its form (`hcloud context create` wants
 * 64 characters, so the placeholder has that form anyway).
 */
const HOST = 'api.hetzner.cloud';
const TOKEN = 'RealGateHcloudToken0000000000000000000000000000000000000000000001';
const PLACEHOLDER = 'agentconnectorsplaceholder00000000000000000000000000000000000000';

const SERVER = {
  id: 4711,
  name: 'gate-server-1',
  status: 'running',
  created: '2025-01-01T00:00:00+00:00',
  public_net: { ipv4: { id: 1, ip: '203.0.113.7', blocked: false, dns_ptr: 'static.7.113.0.203.clients.your-server.de' }, ipv6: { id: 2, ip: '2001:db8::/64', blocked: false, dns_ptr: [] }, floating_ips: [], firewalls: [] },
  private_net: [],
  server_type: { id: 1, name: 'cx11', description: 'CX11', cores: 1, memory: 2, disk: 20, deprecated: false, prices: [], storage_type: 'local', cpu_type: 'shared', architecture: 'x86' },
  datacenter: {
    id: 2,
    name: 'nbg1-dc3',
    description: 'Nuremberg 1 DC 3',
    location: { id: 2, name: 'nbg1', description: 'Nuremberg DC Park 1', country: 'DE', city: 'Nuremberg', latitude: 49.452102, longitude: 11.076665, network_zone: 'eu-central' },
    server_types: { supported: [1], available: [1], available_for_migration: [1] },
  },
  image: null,
  iso: null,
  rescue_enabled: false,
  locked: false,
  backup_window: null,
  outgoing_traffic: 0,
  ingoing_traffic: 0,
  included_traffic: 21990232555520,
  protection: { delete: false, rebuild: false },
  labels: { gate: 'clis' },
  volumes: [],
  load_balancers: [],
  primary_disk_size: 20,
  placement_group: null,
};
const LOCATIONS = [
  { id: 1, name: 'fsn1', description: 'Falkenstein DC Park 1', country: 'DE', city: 'Falkenstein', latitude: 50.47612, longitude: 12.370071, network_zone: 'eu-central' },
  SERVER.datacenter.location,
];

const meta = (total: number): unknown => ({ pagination: { page: 1, per_page: 50, previous_page: null, next_page: null, last_page: 1, total_entries: total } });

function serve(req: IncomingMessage, _body: Buffer, res: ServerResponse): void {
  const json = (status: number, value: unknown): void => {
    const text = JSON.stringify(value);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  };
  if (req.headers.authorization !== `Bearer ${TOKEN}`) return json(401, { error: { code: 'unauthorized', message: 'unable to authenticate' } });
  const path = new URL(req.url ?? '/', `https://${HOST}`).pathname;
  if (req.method === 'GET' && path === '/v1/servers') return json(200, { servers: [SERVER], meta: meta(1) });
  if (req.method === 'GET' && path === '/v1/locations') return json(200, { locations: LOCATIONS, meta: meta(LOCATIONS.length) });
  json(404, { error: { code: 'not_found', message: 'not served by the fake' } });
}

export const hcloudCase: CliCase = {
  name: 'hcloud',
  install: { apt: 'hcloud-cli', bin: '/usr/bin/hcloud' },
  // Debian's build prints "hcloud was not built properly" for `hcloud version`: no version stamped in.
  versionArgs: ['version'],
  providerId: 'hetzner',
  provider: {
    mode: 'tls',
    hosts: [HOST],
    inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
    placeholder: PLACEHOLDER,
    commands: [{ name: 'hcloud', env: { HCLOUD_TOKEN: '{placeholder}' } }],
  },
  token: TOKEN,
  secrets: [TOKEN],
  hosts: [HOST],
  serve,
  steps: [
    { script: 'hcloud server list', expect: /\b4711\s+gate-server-1\s+running\s+203\.0\.113\.7\b/ },
    { script: 'hcloud location list -o noheader -o columns=name,city', expect: /^fsn1\s+Falkenstein\nnbg1\s+Nuremberg$/m },
  ],
  command: 'hcloud server list, hcloud location list',
};
