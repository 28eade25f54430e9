"""The HTTP routes: speech (single, long-form, batch), the WebSocket route, voices, watermark detection, health and metrics. Each validates, admits and hands over; none holds policy."""
