"""The browser tool: headless Chromium inside a sandbox, driven by Playwright on the host."""
