"""What the tests share and no test module owns: the scripted OpenAI-compatible server, the
scripted dialogue and novel, seeded graphs, the browser and ebook readers, the process guard,
the fuzz runner and the test kinds. Test modules import from here, never from each other."""
