// The E2B JS SDK against agentbox: only E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY change.
// Prints one JSON line of what it saw; the pytest wrapper checks it.
import { Sandbox, CommandExitError } from 'e2b'

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
const seen = { id: sbx.sandboxId }
try {
  const r = await sbx.commands.run('echo hi; echo err >&2; pwd')
  seen.run = [r.stdout, r.stderr, r.exitCode]
  try {
    await sbx.commands.run('exit 4')
  } catch (e) {
    seen.failed = e instanceof CommandExitError ? e.exitCode : String(e)
  }
  const bg = await sbx.commands.run('sleep 0.1; echo bg', { background: true })
  seen.background = (await bg.wait()).stdout
  await sbx.files.write('/workspace/js.txt', 'from js')
  seen.read = await sbx.files.read('/workspace/js.txt')
  seen.list = (await sbx.files.list('/workspace')).map((e) => e.name)
  seen.listed = (await Sandbox.list().nextItems()).some((s) => s.sandboxId === sbx.sandboxId)
  try {
    await sbx.commands.run('curl http://example.com')
  } catch (e) {
    seen.denied = String(e.message)
  }
} finally {
  await sbx.kill()
}
console.log(JSON.stringify(seen))
