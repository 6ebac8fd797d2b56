// Drives this server with the official `ollama` JavaScript package, as an app built on it would:
//   node client.mjs HOST MODEL
// prints one JSON object: the streamed chat's pieces and last object, and a generate answer.
import { Ollama } from 'ollama'

const [host, model] = process.argv.slice(2)
const ollama = new Ollama({ host })

const pieces = []
let last = null
const stream = await ollama.chat({
  model,
  messages: [{ role: 'user', content: 'Count from 1 to 5, separated by spaces.' }],
  stream: true,
  options: { temperature: 0, num_predict: 12 },
})
for await (const part of stream) {
  if (part.done) last = part
  else pieces.push(part.message.content)
}

const generated = await ollama.generate({
  model,
  prompt: 'The capital of France is',
  options: { temperature: 0, num_predict: 6 },
})

console.log(JSON.stringify({ pieces, last, generated }))
