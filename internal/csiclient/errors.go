package csiclient

//lint:file-ignore SA1019 x/net's HTTP/2 client is deprecated for net/http's, which does not export the error types this package classifies by (see doc.go).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// protocolError is a call's status when the plugin broke the protocol:
// its answer was not gRPC, was malformed or too large, or broke HTTP/2.
// It is a gRPC status error like any other (status.Code, status.FromError
// and status.Convert see its status); IsProtocolViolation tells it apart.
type protocolError struct{ st *status.Status }

func (e *protocolError) Error() string              { return e.st.Err().Error() }
func (e *protocolError) GRPCStatus() *status.Status { return e.st }

// IsProtocolViolation reports whether err, from a call on the supervision
// connection, means the plugin broke the protocol rather than being slow
// or gone: a reply over the message cap; a malformed reply (bad message
// framing, compression nobody asked for, a malformed grpc-status,
// grpc-message or grpc-status-details-bin, or none at all); an answer that
// is not gRPC (wrong content-type, HTTP status other than 200); or an
// HTTP/2 connection or stream error, found by us or announced by the
// plugin. The error's message says which.
func IsProtocolViolation(err error) bool {
	var pe *protocolError
	return errors.As(err, &pe)
}

// violationf returns a protocolError with code and a message that starts
// by saying it is a violation.
func violationf(code codes.Code, format string, args ...any) error {
	return &protocolError{st: status.New(code, "protocol violation: "+fmt.Sprintf(format, args...))}
}

// contextStatus is the status of a call whose context ended, as grpc-go
// reports it.
func contextStatus(err error) error {
	return status.FromContextError(err).Err()
}

// contextErr is ctx.Err(), or DeadlineExceeded as soon as the deadline
// has passed: the plugin, told the same deadline, may reset the stream a
// moment before ctx's own timer fires, and grpc-go calls that
// DeadlineExceeded too.
func contextErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// connError is the status of a call that found no usable connection.
func connError(ctx context.Context, err error) error {
	switch {
	case contextErr(ctx) != nil:
		return contextStatus(contextErr(ctx))
	case errors.Is(err, errClosed):
		return status.Error(codes.Canceled, "grpc: the client connection is closing")
	}
	return status.Errorf(codes.Unavailable, "connection error: %v", err)
}

// statusError turns the error connect returned for c into the status
// grpc-go would have given, deciding in this order: the status the plugin
// sent; the caller's context; the reply cap; the transport; an answer that
// is not gRPC; a missing grpc-status; and anything else connect refused in
// the answer.
func (c *call) statusError(ctx context.Context, method string, err error) error {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		cerr = connect.NewError(connect.CodeUnknown, err)
	}
	if connect.IsWireError(err) {
		return c.wireStatus(cerr)
	}
	if err := contextErr(ctx); err != nil {
		return contextStatus(err)
	}
	if c.overCap {
		return c.overCapError(method)
	}
	if c.transportErr != nil {
		return transportStatus(c.transportErr)
	}
	if c.resp != nil {
		if err := notGRPC(c.resp); err != nil {
			return err
		}
	}
	if c.bodyErr != nil {
		return transportStatus(c.bodyErr)
	}
	if c.resp != nil && c.bodyEOF && grpcStatusHeader(c.resp) == "" {
		return violationf(codes.Internal, "the answer to %s carries no grpc-status", method)
	}
	// With the transport cleared, a ResourceExhausted of connect's own is
	// a declared message length over the cap (requests are checked before
	// they are sent).
	if cerr.Code() == connect.CodeResourceExhausted {
		return c.overCapError(method)
	}
	// What is left is connect refusing a well-formed HTTP/2 gRPC answer:
	// bad message framing, a compressed message, more or fewer than one
	// message, or a malformed grpc-status, grpc-message or details.
	return violationf(codes.Code(cerr.Code()), "malformed gRPC answer to %s: %s", method, cerr.Message())
}

func (c *call) overCapError(method string) error {
	return violationf(codes.ResourceExhausted, "the reply to %s is larger than the %d-byte message cap", method, c.recvLimit)
}

// wireStatus is the status the plugin sent, with its details.
func (c *call) wireStatus(cerr *connect.Error) error {
	st := &spb.Status{Code: int32(cerr.Code()), Message: cerr.Message()}
	for _, d := range cerr.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	// connect takes the code from grpc-status-details-bin when there is
	// one; grpc-go insists that both agree.
	if c.resp != nil && answerField(c.resp, "Grpc-Status-Details-Bin") != "" {
		if raw, err := strconv.ParseInt(grpcStatusHeader(c.resp), 10, 32); err == nil && int32(raw) != st.Code {
			return violationf(codes.Internal, "grpc-status %d disagrees with grpc-status-details-bin (code %d, %q)", raw, st.Code, st.Message)
		}
	}
	if codes.Code(st.Code) == codes.OK {
		return violationf(codes.Internal, "grpc-status-details-bin says OK for a failed call")
	}
	return status.FromProto(st).Err()
}

// grpcStatusHeader returns the answer's grpc-status.
func grpcStatusHeader(resp *http.Response) string {
	return answerField(resp, "Grpc-Status")
}

// answerField returns a status field of the answer: from its trailers or,
// in a trailers-only answer, its headers.
func answerField(resp *http.Response, name string) string {
	if resp.Trailer.Get("Grpc-Status") != "" {
		return resp.Trailer.Get(name)
	}
	return resp.Header.Get(name)
}

// notGRPC returns a protocolError if resp is not a gRPC answer we can read,
// with the code grpc-go and connect give such answers.
func notGRPC(resp *http.Response) error {
	if resp.StatusCode != http.StatusOK {
		return violationf(httpStatusCode(resp.StatusCode), "not a gRPC answer: HTTP status %q", resp.Status)
	}
	// What connect accepts for the proto codec.
	switch ct := resp.Header.Get("Content-Type"); {
	case ct == "application/grpc", ct == "application/grpc+proto":
	case strings.HasPrefix(ct, "application/grpc+"):
		return violationf(codes.Internal, "not a gRPC answer we can read: content-type %q, not application/grpc", ct)
	default:
		return violationf(codes.Unknown, "not a gRPC answer: content-type %q", ct)
	}
	if enc := resp.Header.Get("Grpc-Encoding"); enc != "" && enc != "identity" {
		return violationf(codes.Internal, "reply compressed with %q, though no compression was offered", enc)
	}
	return nil
}

// httpStatusCode maps a non-200 HTTP status to a gRPC code as the gRPC
// HTTP/2 protocol document does.
func httpStatusCode(code int) codes.Code {
	switch code {
	case http.StatusBadRequest:
		return codes.Internal
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.Unimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return codes.Unavailable
	}
	return codes.Unknown
}

// rstStreamCodes maps the error code of a RST_STREAM from the plugin to a
// gRPC code, as grpc-go does.
var rstStreamCodes = map[http2.ErrCode]codes.Code{
	http2.ErrCodeNo:                 codes.Internal,
	http2.ErrCodeProtocol:           codes.Internal,
	http2.ErrCodeInternal:           codes.Internal,
	http2.ErrCodeFlowControl:        codes.ResourceExhausted,
	http2.ErrCodeSettingsTimeout:    codes.Internal,
	http2.ErrCodeStreamClosed:       codes.Internal,
	http2.ErrCodeFrameSize:          codes.Internal,
	http2.ErrCodeRefusedStream:      codes.Unavailable,
	http2.ErrCodeCancel:             codes.Canceled,
	http2.ErrCodeCompression:        codes.Internal,
	http2.ErrCodeConnect:            codes.Internal,
	http2.ErrCodeEnhanceYourCalm:    codes.ResourceExhausted,
	http2.ErrCodeInadequateSecurity: codes.PermissionDenied,
	http2.ErrCodeHTTP11Required:     codes.Internal,
}

// brokenProtocol reports whether a RST_STREAM or GOAWAY code from the
// plugin says the HTTP/2 exchange itself went wrong. We send nothing an
// HTTP/2 peer may object to, so such a code means the plugin's side is
// broken; the other codes are about load, cancellation or shutdown.
func brokenProtocol(code http2.ErrCode) bool {
	switch code {
	case http2.ErrCodeProtocol, http2.ErrCodeFlowControl, http2.ErrCodeSettingsTimeout,
		http2.ErrCodeStreamClosed, http2.ErrCodeFrameSize, http2.ErrCodeCompression,
		http2.ErrCodeHTTP11Required:
		return true
	}
	return false
}

// fromPeer is the cause x/net gives a StreamError made from the plugin's
// RST_STREAM; it prints as the error's suffix, which connect matches too.
const fromPeer = "received from peer"

// transportStatus is the status of a call that the HTTP/2 transport ended.
func transportStatus(err error) error {
	var (
		se http2.StreamError
		ce http2.ConnectionError
		ga http2.GoAwayError
	)
	switch {
	case errors.As(err, &se) && se.Cause != nil && se.Cause.Error() == fromPeer:
		code, ok := rstStreamCodes[se.Code]
		if !ok {
			code = codes.Unknown
		}
		if brokenProtocol(se.Code) {
			return violationf(code, "the plugin reset the stream with %v", se.Code)
		}
		return status.Errorf(code, "stream terminated by RST_STREAM with error code: %v", se.Code)
	case errors.As(err, &se):
		// x/net found the plugin's stream broken and reset it.
		if se.Cause == nil {
			return violationf(codes.Internal, "the plugin's reply broke HTTP/2 (stream error %v)", se.Code)
		}
		return violationf(codes.Internal, "the plugin's reply broke HTTP/2 (stream error %v): %v", se.Code, se.Cause)
	case errors.As(err, &ce):
		return violationf(codes.Internal, "the plugin broke HTTP/2 (connection error %v); the connection is closed", http2.ErrCode(ce))
	case errors.Is(err, http2.ErrFrameTooLarge):
		return violationf(codes.Internal, "the plugin sent an HTTP/2 frame larger than the %d bytes allowed; the connection is closed", maxFrameSize)
	case errors.As(err, &ga):
		if brokenProtocol(ga.ErrCode) {
			return violationf(codes.Unavailable, "the plugin closed the connection with GOAWAY %v (%q)", ga.ErrCode, ga.DebugData)
		}
		return status.Errorf(codes.Unavailable, "the plugin sent GOAWAY (%v, %q) and closed the connection before answering", ga.ErrCode, ga.DebugData)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Only writes have deadlines: the plugin stopped reading.
		return status.Errorf(codes.Unavailable, "connection error: the plugin stopped reading (write timed out): %v", err)
	}
	return status.Errorf(codes.Unavailable, "connection error: %v", err)
}
