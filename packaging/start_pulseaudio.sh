#!/usr/bin/env bash
# Start a PulseAudio daemon with a null sink as the default output and its
# monitor as the default input (idempotent). On a headless machine this gives
# PortAudio a real device to play into and record from.
set -euo pipefail
command -v pulseaudio >/dev/null || { echo "pulseaudio is not installed" >&2; exit 1; }
if ! pactl info >/dev/null 2>&1; then
  pulseaudio --daemonize=yes --exit-idle-time=-1 -n \
    --load="module-null-sink sink_name=vsink" --load=module-native-protocol-unix
  for _ in $(seq 50); do pactl info >/dev/null 2>&1 && break; sleep 0.1; done
fi
pactl list short sinks | grep -q vsink || pactl load-module module-null-sink sink_name=vsink >/dev/null
pactl set-default-sink vsink
pactl set-default-source vsink.monitor
