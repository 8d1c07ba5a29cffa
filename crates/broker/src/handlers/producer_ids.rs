//! InitProducerId for idempotent producers.

use spate_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};

use crate::Broker;

/// Gives an idempotent producer its id and epoch. A producer that presents its current id and
/// epoch (KIP-360) gets the next epoch of the same id. Transactional producers are the
/// transaction coordinator's (`handlers::transactions::init_producer_id`).
pub fn init(b: &Broker, req: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut resp = InitProducerIdResponse::default();
    let (id, epoch) = (req.producer_id.0, req.producer_epoch);
    if id >= 0 && (0..i16::MAX - 1).contains(&epoch) {
        resp.producer_id = id.into();
        resp.producer_epoch = epoch + 1;
        return resp;
    }
    match b.topology().allocate_producer_id(b) {
        Ok(id) => {
            resp.producer_id = id.into();
            resp.producer_epoch = 0;
        }
        Err(e) => resp.error_code = e.code(),
    }
    resp
}
