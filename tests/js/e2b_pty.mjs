// A terminal (sbx.pty) and closeStdin with the E2B JS SDK against agentbox.
// Prints one JSON line of what it saw; the pytest wrapper checks it.
import { Sandbox } from 'e2b'

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
const seen = { id: sbx.sandboxId }
const enc = new TextEncoder()
try {
  let out = ''
  let waiting = null // [text, resolve]: settled when the output holds text
  const until = (text) =>
    new Promise((resolve) => {
      waiting = [text, resolve]
      if (out.includes(text)) resolve()
    })
  const term = await sbx.pty.create({
    cols: 80,
    rows: 24,
    envs: { JSVAR: 'from-js' },
    onData: (data) => {
      out += new TextDecoder().decode(data)
      if (waiting && out.includes(waiting[0])) waiting[1]()
    },
  })
  // $((1+1)): the marker differs from the echoed input
  await sbx.pty.sendInput(term.pid, enc.encode('echo $JSVAR-$((1+1)); stty size\n'))
  await until('24 80')
  await sbx.pty.resize(term.pid, { cols: 132, rows: 43 })
  await sbx.pty.sendInput(term.pid, enc.encode('stty size; exit 0\n'))
  seen.exit = (await term.wait()).exitCode
  seen.pty = out

  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await cat.sendStdin('piped ')
  await sbx.commands.sendStdin(cat.pid, 'to cat')
  await cat.closeStdin()
  const done = await cat.wait()
  seen.cat = [done.stdout, done.exitCode]
} finally {
  await sbx.kill()
}
console.log(JSON.stringify(seen))
